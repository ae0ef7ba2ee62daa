"""Images for chat: recognised by their content, size-capped, sent as data URLs.

A file's extension says nothing: the first bytes decide whether it is PNG, JPEG,
GIF or WebP, and the header must give sane dimensions.  Before anything is decoded,
a PNG's compressed data must inflate to exactly what its pixels need (a bomb or a
truncated picture is refused) and every GIF frame must be within the pixel limit.
Every picture is then decoded completely and encoded again: the engine only ever
gets a picture that decoded completely.  Images that are too big to send (bytes or
pixels) are downscaled; small ones stay lossless (PNG; JPEG stays JPEG); WebP becomes
PNG because llama-server decodes WebP only when built with ffmpeg.
"""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from k3desk.core.errors import ChatError

if TYPE_CHECKING:
    from k3desk.core.catalog.model import Tier

ImageFormat = Literal["png", "jpeg", "gif", "webp"]
MIME: dict[ImageFormat, str] = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
}
EXTENSION: dict[ImageFormat, str] = {"png": "png", "jpeg": "jpg", "gif": "gif", "webp": "webp"}

# Files larger than this are refused without being read.
MAX_FILE_BYTES = 64 * 1024**2
# Images with more pixels than this are refused (decompression bombs, scans).
MAX_PIXELS = 64_000_000
# Images larger than these are downscaled before sending.
MAX_SIDE = 2048
MAX_SEND_BYTES = 4 * 1024**2


class ImageError(ChatError):
    """An image cannot be attached (not an image, damaged, too large, or no vision)."""


@dataclass(frozen=True)
class ImageInfo:
    format: ImageFormat
    width: int
    height: int


@dataclass(frozen=True)
class PreparedImage:
    """An image ready to send: validated bytes, their format and dimensions."""

    data: bytes
    format: ImageFormat
    width: int
    height: int
    name: str = ""  # the file name it came from, for messages and history
    original_bytes: int = 0  # size of the file before any downscaling
    resized: bool = False

    @property
    def mime(self) -> str:
        return MIME[self.format]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"

    def content_part(self) -> dict[str, Any]:
        """The OpenAI ``image_url`` content part for a user message."""
        return {"type": "image_url", "image_url": {"url": self.data_url()}}


def sniff(head: bytes) -> ImageFormat | None:
    """The image format from a file's first bytes (at least 12), or None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


def inspect(data: bytes, name: str = "image") -> ImageInfo:
    """Recognise ``data`` by content and read its dimensions from the header.

    Raises ImageError naming ``name`` when it is not a supported image or its
    header is damaged.
    """
    fmt = sniff(data[:16])
    if fmt is None:
        raise ImageError(
            f"{name} is not an image k3desk can send (its content is not PNG, JPEG, GIF or WebP).",
            "Attach a PNG, JPEG, GIF or WebP picture; the file name's extension does not matter.",
        )
    try:
        width, height = _DIMENSIONS[fmt](data)
    except (struct.error, IndexError, ValueError) as exc:
        raise _damaged(name, fmt, str(exc)) from None
    if width <= 0 or height <= 0:
        raise _damaged(name, fmt, f"it claims {width}x{height} pixels")
    return ImageInfo(fmt, width, height)


def load_image(
    path: Path | str,
    *,
    max_side: int = MAX_SIDE,
    max_send_bytes: int = MAX_SEND_BYTES,
) -> PreparedImage:
    """Read, validate and if needed downscale the image at ``path``."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise ImageError(f"Image {p} does not exist.", "Check the path.") from None
    except OSError as exc:
        raise ImageError(f"Cannot read image {p}: {exc.strerror or exc}.") from None
    if not p.is_file():
        raise ImageError(f"{p} is not a file.", "Attach an image file.")
    if size > MAX_FILE_BYTES:
        raise ImageError(
            f"Image {p} is {size / 1024**2:.0f} MiB; k3desk refuses images over "
            f"{MAX_FILE_BYTES // 1024**2} MiB.",
            "Export a smaller copy (a few megapixels is plenty for the model) and attach that.",
        )
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ImageError(f"Cannot read image {p}: {exc.strerror or exc}.") from None
    return prepare_image(data, name=str(p), max_side=max_side, max_send_bytes=max_send_bytes)


def prepare_image(
    data: bytes,
    *,
    name: str = "image",
    max_side: int = MAX_SIDE,
    max_send_bytes: int = MAX_SEND_BYTES,
) -> PreparedImage:
    """Validate image bytes and downscale/re-encode them when needed."""
    info = inspect(data, name)
    if info.width * info.height > MAX_PIXELS:
        raise ImageError(
            f"Image {name} is {info.width}x{info.height} pixels "
            f"({info.width * info.height / 1e6:.0f} megapixels); the limit is "
            f"{MAX_PIXELS / 1e6:.0f} megapixels.",
            "Export a smaller copy and attach that.",
        )
    _check_structure(data, info, name)
    too_big = max(info.width, info.height) > max_side or len(data) > max_send_bytes
    # never sent as it is: decoded completely here (a truncated or damaged picture is
    # refused with its name, not by the engine mid-request) and encoded again, so the
    # engine only ever reads a picture that decoded completely and whose compressed
    # data is no larger than its pixels need.  A small one stays lossless (JPEG stays
    # JPEG); WebP becomes PNG: llama-server decodes WebP only when built with ffmpeg.
    return _reencode(
        data, info, name, max_side, max_send_bytes, lossless=not too_big and info.format != "jpeg"
    )


def ensure_vision(
    vision: bool | None,
    *,
    where: str,
    tier: Tier | None = None,
    mmproj: Path | None = None,
) -> None:
    """Refuse images up front when the engine or the tier cannot see them.

    ``vision`` is what the engine reports (``/props`` modalities.vision; None when
    it does not say).  ``tier`` is the local tier, when known: a tier without a
    projector cannot take images whatever the engine says.
    """
    if tier is not None and (not tier.mmproj or tier.vision == "none") and mmproj is None:
        raise ImageError(
            f"The tier {tier.name} ({tier.repo}) has no vision projector (mmproj), "
            "so it cannot read images.",
            "Send the message without images, or pick a tier that ships an mmproj file.",
        )
    if vision is False:
        raise ImageError(
            f"The engine at {where} has no vision: it was started without an image "
            "projector (mmproj), so it cannot read images.",
            "Start the engine with the tier's mmproj file (--mmproj), or send text only.",
        )


# ----------------------------------------------------------------- internals


def _damaged(name: str, fmt: ImageFormat, why: str, where: str = "its header") -> ImageError:
    return ImageError(
        f"{name} starts like a {fmt.upper()} image but {where} is damaged ({why}).",
        "Open it in an image viewer and save it again, then attach the new file.",
    )


def _png_size(data: bytes) -> tuple[int, int]:
    if data[12:16] != b"IHDR":
        raise ValueError("no IHDR chunk")
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)


def _gif_size(data: bytes) -> tuple[int, int]:
    w, h = struct.unpack("<HH", data[6:10])
    return int(w), int(h)


_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(data: bytes) -> tuple[int, int]:
    i = 2
    n = len(data)
    while i < n:
        # skip fill bytes before a marker
        if data[i] != 0xFF:
            raise ValueError(f"no marker at byte {i}")
        while i < n and data[i] == 0xFF:
            i += 1
        if i >= n:
            break
        marker = data[i]
        i += 1
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            continue  # markers without a length
        if marker == 0xD9:
            break
        (seg_len,) = struct.unpack(">H", data[i : i + 2])
        if seg_len < 2:
            raise ValueError("bad segment length")
        if marker in _JPEG_SOF:
            h, w = struct.unpack(">HH", data[i + 3 : i + 7])
            return int(w), int(h)
        i += seg_len
    raise ValueError("no frame header (SOF) found")


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8 ":
        if data[23:26] != b"\x9d\x01\x2a":
            raise ValueError("bad VP8 frame tag")
        w, h = struct.unpack("<HH", data[26:30])
        return int(w & 0x3FFF), int(h & 0x3FFF)
    if chunk == b"VP8L":
        if data[20] != 0x2F:
            raise ValueError("bad VP8L signature")
        b = data[21:25]
        w = 1 + (((b[1] & 0x3F) << 8) | b[0])
        h = 1 + (((b[3] & 0x0F) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6))
        return w, h
    if chunk == b"VP8X":
        w = 1 + int.from_bytes(data[24:27], "little")
        h = 1 + int.from_bytes(data[27:30], "little")
        return w, h
    raise ValueError(f"unknown WebP chunk {chunk!r}")


_DIMENSIONS = {"png": _png_size, "jpeg": _jpeg_size, "gif": _gif_size, "webp": _webp_size}


# A GIF may hold any number of frames, each with its own size (only the first is sent).
MAX_FRAMES = 10_000


def _check_structure(data: bytes, info: ImageInfo, name: str) -> None:
    """What the header alone does not tell, read without decoding pixels: a PNG's
    compressed data inflates to exactly what its pixels need (more is a decompression
    bomb, less a truncated picture), every GIF frame is within the pixel limit."""
    if info.format == "png":
        _check_png_data(data, info, name)
    elif info.format == "gif":
        _check_gif_frames(data, info, name)


def _png_expected_bytes(
    width: int, height: int, bit_depth: int, color_type: int, adam7: bool
) -> int:
    """The size of a PNG's filtered scanlines (what its IDAT data must inflate to):
    ``png_read_start_row``/``PNG_ROWBYTES`` in libpng, and the Adam7 passes."""
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(color_type)
    if channels is None or bit_depth not in (1, 2, 4, 8, 16):
        raise ValueError(f"colour type {color_type} with bit depth {bit_depth}")
    bits = channels * bit_depth

    def rows(w: int, h: int) -> int:
        return 0 if w <= 0 or h <= 0 else h * (1 + (w * bits + 7) // 8)

    if not adam7:
        return rows(width, height)
    passes = (
        (0, 0, 8, 8),
        (4, 0, 8, 8),
        (0, 4, 4, 8),
        (2, 0, 4, 4),
        (0, 2, 2, 4),
        (1, 0, 2, 2),
        (0, 1, 1, 2),
    )
    return sum(
        rows((width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy) for x0, y0, dx, dy in passes
    )


def _check_png_data(data: bytes, info: ImageInfo, name: str) -> None:
    try:
        bit_depth, color_type, _, _, interlace = data[24:29]
        expected = _png_expected_bytes(
            info.width, info.height, bit_depth, color_type, interlace == 1
        )
    except ValueError as exc:
        raise _damaged(name, "png", str(exc)) from None
    inflater = zlib.decompressobj()
    got = 0
    pos = 8
    ended = False
    try:
        while pos + 8 <= len(data):
            length, kind = struct.unpack(">I4s", data[pos : pos + 8])
            body = data[pos + 8 : pos + 8 + length]
            pos += 12 + length
            if kind == b"IEND":
                break
            if kind != b"IDAT" or ended:
                continue
            while body:
                # at most one byte past what its pixels need, a MiB at a time: a bomb
                # is stopped there, not after inflating it all
                out = inflater.decompress(body, min(1 << 20, expected - got + 1))
                got += len(out)
                if got > expected:
                    raise ImageError(
                        f"{name} is a PNG whose compressed data inflates to more than its "
                        f"{info.width}x{info.height} pixels need ({expected:,} bytes): "
                        "a decompression bomb, refused.",
                        "Open it in an image viewer and save it again, then attach the new file.",
                    )
                body = inflater.unconsumed_tail
                if inflater.eof:
                    ended = True
                    break
    except zlib.error as exc:
        raise _damaged(name, "png", f"it cannot be decoded: {exc}", "it") from None
    if got < expected or not ended:
        raise _damaged(
            name,
            "png",
            f"it cannot be decoded: its pixel data ends early ({got:,} of {expected:,} bytes)",
            "it",
        )


def _check_gif_frames(data: bytes, info: ImageInfo, name: str) -> None:
    """Walk a GIF's blocks (``GIF89a`` spec, sections 18-27) and bound every frame."""
    try:
        pos = 13
        flags = data[10]
        if flags & 0x80:
            pos += 3 * (2 << (flags & 0x07))
        frames = 0
        while pos < len(data):
            block = data[pos]
            if block == 0x3B:  # trailer
                return
            if block == 0x21:  # extension: label, then sub-blocks
                pos = _skip_sub_blocks(data, pos + 2)
                continue
            if block != 0x2C:
                raise ValueError(f"unknown block 0x{block:02x} at byte {pos}")
            left, top, w, h, fl = struct.unpack("<HHHHB", data[pos + 1 : pos + 10])
            frames += 1
            if w * h > MAX_PIXELS or (left + w) * (top + h) > MAX_PIXELS:
                raise ImageError(
                    f"Image {name} has a frame of {w}x{h} pixels at {left},{top}; the limit "
                    f"is {MAX_PIXELS / 1e6:.0f} megapixels.",
                    "Export a smaller copy and attach that.",
                )
            if frames > MAX_FRAMES:
                raise ImageError(
                    f"Image {name} has more than {MAX_FRAMES:,} frames.",
                    "Attach a still picture (one frame).",
                )
            pos += 10
            if fl & 0x80:
                pos += 3 * (2 << (fl & 0x07))
            pos = _skip_sub_blocks(data, pos + 1)  # after the LZW minimum code size
    except (IndexError, struct.error):
        raise _damaged(name, "gif", "it cannot be decoded: it ends early", "it") from None
    except ValueError as exc:
        raise _damaged(name, "gif", f"it cannot be decoded: {exc}", "it") from None


def _skip_sub_blocks(data: bytes, pos: int) -> int:
    while True:
        size = data[pos]
        pos += 1 + size
        if size == 0:
            return pos


def _reencode(
    data: bytes,
    info: ImageInfo,
    name: str,
    max_side: int,
    max_send_bytes: int,
    *,
    lossless: bool = False,
) -> PreparedImage:
    """Downscale to ``max_side`` and re-encode (PNG when lossless or with alpha, else JPEG)."""
    try:
        from PIL import Image, ImageFile, UnidentifiedImageError
    except ImportError:  # pragma: no cover - Pillow is a dependency
        raise ImageError(
            f"Image {name} cannot be checked: k3desk decodes every picture before sending "
            "it, and Pillow is not installed.",
            "Install Pillow (pip install Pillow).",
        ) from None
    try:
        with warnings.catch_warnings(), Image.open(io.BytesIO(data)) as img:
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            if img.width * img.height > MAX_PIXELS:
                raise ImageError(
                    f"Image {name} decodes as {img.width}x{img.height} pixels; the limit "
                    f"is {MAX_PIXELS / 1e6:.0f} megapixels.",
                    "Export a smaller copy and attach that.",
                )
            if ImageFile.LOAD_TRUNCATED_IMAGES:  # someone asked Pillow to pad truncated ones
                raise ImageError(
                    f"{name} cannot be checked: Pillow is set to accept truncated images."
                )
            if info.format == "jpeg":  # decoded at 1/2 to 1/8 scale: a fraction of the memory
                img.draft("RGB", (max_side, max_side))
            img.load()
            alpha = _has_alpha(img)
            # shrink first, in place: the copies below are of a small picture, not a big one
            img.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
            frame = img.convert("RGBA") if alpha else img.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(
            f"Image {name} was refused: {exc}",
            "Export a smaller copy and attach that.",
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise _damaged(name, info.format, f"it cannot be decoded: {exc}", "it") from None
    side = max_side
    while True:
        scaled = frame.copy()
        scaled.thumbnail((side, side), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        fmt: ImageFormat
        if scaled.mode == "RGBA" or lossless:
            scaled.save(buf, format="PNG", optimize=True)
            fmt = "png"
        else:
            scaled.save(buf, format="JPEG", quality=90)
            fmt = "jpeg"
        out = buf.getvalue()
        if len(out) <= max_send_bytes or side <= 256:
            break
        side = int(side * 0.75)
    if len(out) > max_send_bytes:
        raise ImageError(
            f"Image {name} is still {len(out) / 1024**2:.1f} MiB after shrinking it.",
            "Attach a smaller or simpler picture.",
        )
    return PreparedImage(
        out,
        fmt,
        scaled.width,
        scaled.height,
        name,
        len(data),
        resized=(scaled.width, scaled.height) != (info.width, info.height),
    )


def _has_alpha(img: Any) -> bool:
    return bool(img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info)
