"""The daemon: ``root`` (the composition root: extensions, instances, gateway, spool, metrics),
``facade`` (what the control socket asks of it), ``reload`` (the config read again, the diff
applied), ``run`` (startup phases, signals, shutdown), ``systemd`` (sd_notify and the watchdog),
``metrics`` (Prometheus), ``health`` (the process's own figures), ``fdlimits`` (fds shared out).
"""

__all__ = ()  # the modules are the public surface
