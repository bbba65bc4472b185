"""What one gateway client sees: profiles (``profiles``) and the search mode's index (``search``)."""

__all__ = ()  # the modules are the public surface
