"""Images for chat: recognised by their content, size-capped, sent as data URLs.

A file's extension says nothing: the first bytes decide whether it is PNG, JPEG,
GIF or WebP, and the header must give sane dimensions.  Images that are too big to
send (bytes or pixels) are downscaled with Pillow; WebP is re-encoded as PNG because
llama-server decodes WebP only when built with ffmpeg.
"""

from __future__ import annotations

import base64
import hashlib
import io
import struct
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
    too_big = max(info.width, info.height) > max_side or len(data) > max_send_bytes
    if not too_big and info.format != "webp":
        # sent as it is: decode it here first, so that a truncated or damaged picture is
        # refused with its name rather than by the engine, mid-request
        _check_decodes(data, info, name)
        return PreparedImage(data, info.format, info.width, info.height, name, len(data))
    # WebP that needs no shrinking is converted losslessly (PNG)
    return _reencode(data, info, name, max_side, max_send_bytes, lossless=not too_big)


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


def _check_decodes(data: bytes, info: ImageInfo, name: str) -> None:
    """Decode every pixel of ``data`` (at most ``MAX_SIDE`` squared: the caller sends
    only small pictures unchanged), or raise the damaged-image error naming ``name``."""
    try:
        from PIL import Image, ImageFile, UnidentifiedImageError
    except ImportError:  # pragma: no cover - Pillow is a dependency
        return
    if ImageFile.LOAD_TRUNCATED_IMAGES:  # someone asked Pillow to pad truncated images
        raise ImageError(f"{name} cannot be checked: Pillow is set to accept truncated images.")
    try:
        with Image.open(io.BytesIO(data)) as img:
            if (img.width, img.height) != (info.width, info.height):
                raise ValueError(f"it decodes as {img.width}x{img.height}")
            img.load()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise _damaged(name, info.format, f"it cannot be decoded: {exc}", "it") from None


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
        from PIL import Image, UnidentifiedImageError
    except ImportError:  # pragma: no cover - Pillow is a dependency
        raise ImageError(
            f"Image {name} ({info.width}x{info.height}, {len(data) / 1024**2:.1f} MiB) "
            f"is larger than k3desk sends ({max_side} pixels a side, "
            f"{max_send_bytes / 1024**2:.0f} MiB) and Pillow is not installed to shrink it.",
            "Install Pillow (pip install Pillow) or attach a smaller copy.",
        ) from None
    try:
        with Image.open(io.BytesIO(data)) as img:
            if info.format == "jpeg":  # decoded at 1/2 to 1/8 scale: a fraction of the memory
                img.draft("RGB", (max_side, max_side))
            img.load()
            alpha = _has_alpha(img)
            # shrink first, in place: the copies below are of a small picture, not a big one
            img.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
            frame = img.convert("RGBA") if alpha else img.convert("RGB")
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
