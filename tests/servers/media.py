"""Fast raw-protocol server returning binary content of exact sizes: the media spool's fixture.

Tools (every size is the DECODED byte count; ``seed`` defaults to 0):

* ``image(bytes=1024, mb=None, mime="image/png", seed=0)``: text ``raw=<n>``, then an image
  block of n bytes (``mb`` in MiB, instead of ``bytes``).
* ``audio(bytes, seed=0)``: one ``audio/wav`` block.
* ``blob(bytes, seed=0)``: one embedded ``resource`` with ``blob``, ``file:///fixture/blob.bin``.
* ``mixed(bytes, seed=0)``: text "before", image(bytes), text "middle", an embedded text
  resource ``file:///a.txt`` ("hello"), image(16), audio(bytes), blob(bytes), a
  ``resource_link`` to ``file:///x``; ``structuredContent`` ``{"ok": true}``.
* ``bad_base64()``: an ``image/png`` block whose ``data`` is 400,000 chars of "!" (not base64).
* ``sha256(bytes, seed=0, kind="image")``: the hex digest of the payload ``kind`` (image, audio
  or blob) would return for the same arguments, as text.

Payloads are deterministic: a header (the PNG signature, a 44-byte WAV header, nothing for a
blob) cut to n bytes, then ``random.Random(seed).randbytes(n - len(header))``. The response
line is written in pieces (``_raw.Base64``), so 20 MiB takes a fraction of a second.
"""

from __future__ import annotations

import _raw

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DEFAULT_IMAGE_BYTES = 1024
BAD_BASE64 = "!" * 400_000


def _le(value: int, size: int) -> bytes:
    return max(0, value).to_bytes(size, "little")


def _wav_header(n: int) -> bytes:
    """A 44-byte PCM WAV header (8 kHz, mono, 8-bit) for a file of n bytes."""
    fmt = _le(1, 2) + _le(1, 2) + _le(8000, 4) + _le(8000, 4) + _le(1, 2) + _le(8, 2)
    return b"RIFF" + _le(n - 8, 4) + b"WAVE" + b"fmt " + _le(16, 4) + fmt + b"data" + _le(n - 44, 4)


def payload(kind: str, n: int, seed: int = 0) -> bytes:
    """The decoded bytes of an image, audio or blob of *n* bytes."""
    import random  # costs ~4 ms; only calls need it, not the start

    if n < 0:
        raise ValueError(f"bytes must be >= 0, got {n}")
    headers = {"image": PNG_SIGNATURE, "audio": _wav_header(n), "blob": b""}
    header = headers[kind][:n]
    return header + random.Random(seed).randbytes(n - len(header))


def _size(args: _raw.Args, default: int | None = None) -> int:
    if args.get("bytes") is not None:
        return int(args["bytes"])
    if args.get("mb") is not None:
        return round(float(args["mb"]) * (1 << 20))
    if default is None:
        raise ValueError("give the size as bytes")
    return default


def _seed(args: _raw.Args) -> int:
    return int(args.get("seed", 0))


def _image_block(n: int, seed: int, mime: str = "image/png") -> dict[str, object]:
    return {"type": "image", "data": _raw.Base64(payload("image", n, seed)), "mimeType": mime}


def _audio_block(n: int, seed: int) -> dict[str, object]:
    return {"type": "audio", "data": _raw.Base64(payload("audio", n, seed)), "mimeType": "audio/wav"}


def _blob_block(n: int, seed: int) -> dict[str, object]:
    resource = {
        "uri": "file:///fixture/blob.bin",
        "mimeType": "application/octet-stream",
        "blob": _raw.Base64(payload("blob", n, seed)),
    }
    return {"type": "resource", "resource": resource}


def image(args: _raw.Args) -> _raw.Content:
    """Text ``raw=<n>`` and an image of n decoded bytes."""
    n = _size(args, DEFAULT_IMAGE_BYTES)
    return [_raw.text(f"raw={n}"), _image_block(n, _seed(args), str(args.get("mime") or "image/png"))]


def audio(args: _raw.Args) -> _raw.Content:
    """One audio/wav block of n decoded bytes."""
    return [_audio_block(_size(args), _seed(args))]


def blob(args: _raw.Args) -> _raw.Content:
    """One embedded blob resource of n decoded bytes."""
    return [_blob_block(_size(args), _seed(args))]


def mixed(args: _raw.Args) -> dict[str, object]:
    """Every content type in a fixed order, plus structuredContent."""
    n, seed = _size(args), _seed(args)
    content = [
        _raw.text("before"),
        _image_block(n, seed),
        _raw.text("middle"),
        {
            "type": "resource",
            "resource": {"uri": "file:///a.txt", "mimeType": "text/plain", "text": "hello"},
        },
        _image_block(16, seed),
        _audio_block(n, seed),
        _blob_block(n, seed),
        {"type": "resource_link", "uri": "file:///x", "name": "x"},
    ]
    return {"content": content, "structuredContent": {"ok": True}}


def bad_base64(args: _raw.Args) -> _raw.Content:
    """An image whose data is not base64 at all."""
    return [{"type": "image", "data": BAD_BASE64, "mimeType": "image/png"}]


def sha256(args: _raw.Args) -> _raw.Content:
    """The sha256 hex digest of the payload image, audio or blob would return."""
    import hashlib

    kind = str(args.get("kind") or "image")
    if kind not in ("image", "audio", "blob"):
        raise ValueError(f"kind must be image, audio or blob, got {kind!r}")
    return [_raw.text(hashlib.sha256(payload(kind, _size(args), _seed(args))).hexdigest())]


_BYTES = {"bytes": {"type": "integer", "minimum": 0}}
_SEED = {"seed": {"type": "integer"}}
TOOLS = {
    "image": _raw.Tool(
        image,
        "An image of exactly n decoded bytes (PNG signature + seeded random).",
        {**_BYTES, "mb": {"type": "number"}, "mime": {"type": "string"}, **_SEED},
    ),
    "audio": _raw.Tool(audio, "An audio/wav block of n decoded bytes.", {**_BYTES, **_SEED}, ("bytes",)),
    "blob": _raw.Tool(blob, "An embedded blob resource of n decoded bytes.", {**_BYTES, **_SEED}, ("bytes",)),
    "mixed": _raw.Tool(mixed, "Every content type, in a fixed order.", {**_BYTES, **_SEED}, ("bytes",)),
    "bad_base64": _raw.Tool(bad_base64, "An image whose data is not base64."),
    "sha256": _raw.Tool(
        sha256,
        "sha256 of the payload image/audio/blob returns for the same arguments.",
        {**_BYTES, "mb": {"type": "number"}, **_SEED, "kind": {"type": "string"}},
    ),
}


def main() -> None:
    """Serve until stdin closes."""
    _raw.serve("media", TOOLS)


if __name__ == "__main__":
    main()
