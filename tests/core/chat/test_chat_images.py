"""Images are recognised by their bytes, capped in size, and refused with reasons."""

from __future__ import annotations

import base64
import io
import random
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from k3desk.core.catalog.model import Tier
from k3desk.core.chat.images import (
    MAX_PIXELS,
    ImageError,
    ensure_vision,
    inspect,
    load_image,
    prepare_image,
)


def encode(fmt: str, size: tuple[int, int], mode: str = "RGB", noise: bool = False) -> bytes:
    if noise:
        rng = random.Random(0)
        img = Image.frombytes(mode, size, rng.randbytes(size[0] * size[1] * len(mode)))
    else:
        img = Image.new(mode, size, (10, 120, 200, 128)[: len(mode)])
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("fmt", "expected", "mime"),
    [("PNG", "png", "image/png"), ("JPEG", "jpeg", "image/jpeg"), ("GIF", "png", "image/png")],
)
def test_formats_are_recognised_with_dimensions(
    tmp_path: Path, fmt: str, expected: str, mime: str
) -> None:
    p = tmp_path / "picture.bin"  # the extension says nothing
    p.write_bytes(encode(fmt, (37, 21)))
    img = load_image(p)
    assert (img.format, img.width, img.height, img.mime) == (expected, 37, 21, mime)
    # decoded completely and encoded again: the same picture, lossless unless a JPEG
    with Image.open(io.BytesIO(img.data)) as sent, Image.open(io.BytesIO(p.read_bytes())) as was:
        assert sent.size == was.size
        if fmt != "JPEG":
            assert sent.convert("RGB").tobytes() == was.convert("RGB").tobytes()
    assert img.data_url().startswith(f"data:{mime};base64,")
    assert base64.b64decode(img.data_url().split(",", 1)[1]) == img.data


@pytest.mark.parametrize("lossless", [True, False])
def test_webp_is_recognised_and_sent_as_png(tmp_path: Path, lossless: bool) -> None:
    # llama-server decodes WebP only when built with ffmpeg, so it is re-encoded
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (0, 90, 30)).save(buf, format="WEBP", lossless=lossless)
    assert inspect(buf.getvalue()).format == "webp"
    assert (inspect(buf.getvalue()).width, inspect(buf.getvalue()).height) == (40, 30)
    p = tmp_path / "x.webp"
    p.write_bytes(buf.getvalue())
    img = load_image(p)
    assert (img.format, img.width, img.height) == ("png", 40, 30)
    assert img.data.startswith(b"\x89PNG")


def test_text_named_png_is_refused_naming_the_file(tmp_path: Path) -> None:
    p = tmp_path / "holiday.png"
    p.write_text("this is not a picture\n")
    with pytest.raises(ImageError) as err:
        load_image(p)
    assert str(p) in err.value.message
    assert "not PNG, JPEG, GIF or WebP" in err.value.message
    assert "extension does not matter" in err.value.hint


def test_jpeg_named_png_is_accepted_as_jpeg(tmp_path: Path) -> None:
    p = tmp_path / "photo.png"
    p.write_bytes(encode("JPEG", (64, 48)))
    img = load_image(p)
    assert img.format == "jpeg"
    assert img.mime == "image/jpeg"
    assert img.content_part()["image_url"]["url"].startswith("data:image/jpeg;base64,/9j/")


def test_damaged_header_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "broken.png"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    with pytest.raises(ImageError, match="starts like a PNG image but its header is damaged"):
        load_image(p)
    jpeg = encode("JPEG", (8, 8))
    with pytest.raises(ImageError, match="JPEG"):
        prepare_image(jpeg[:4] + b"\x00" * 20, name="cut.jpg")


def test_huge_photo_is_downscaled(tmp_path: Path) -> None:
    p = tmp_path / "camera.jpg"
    p.write_bytes(encode("JPEG", (4000, 3000)))
    img = load_image(p)
    assert img.resized
    assert (img.width, img.height) == (2048, 1536)
    assert img.format == "jpeg"
    assert img.original_bytes == p.stat().st_size
    assert inspect(img.data).width == 2048


def test_heavy_file_is_shrunk_below_the_send_cap() -> None:
    data = encode("PNG", (1200, 1200), noise=True)
    assert len(data) > 1_000_000
    img = prepare_image(data, name="noise.png", max_send_bytes=300_000)
    assert len(img.data) <= 300_000
    assert img.resized


def test_transparency_is_kept_as_png() -> None:
    data = encode("PNG", (3000, 100), mode="RGBA")
    img = prepare_image(data, name="logo.png")
    assert img.format == "png"
    assert img.width == 2048


def _png_header(w: int, h: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    chunk = (
        struct.pack(">I", len(ihdr))
        + b"IHDR"
        + ihdr
        + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    )
    return b"\x89PNG\r\n\x1a\n" + chunk


def test_too_many_pixels_is_refused_before_decoding() -> None:
    side = int(MAX_PIXELS**0.5) + 100
    with pytest.raises(ImageError) as err:
        prepare_image(_png_header(side, side), name="scan.png")
    assert f"{side}x{side} pixels" in err.value.message


def test_missing_and_oversized_files(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="does not exist"):
        load_image(tmp_path / "nope.png")
    big = tmp_path / "big.png"
    with big.open("wb") as fh:
        fh.write(_png_header(100, 100))
        fh.truncate(65 * 1024**2)  # sparse: no real disk use
    with pytest.raises(ImageError, match="refuses images over 64 MiB"):
        load_image(big)


def _tier(mmproj: tuple[str, ...], vision: str) -> Tier:
    return Tier(
        id="t",
        publisher="p",
        name="IQ1_S",
        repo="p/Kimi-K3-GGUF",
        include=("*",),
        first_shard="a.gguf",
        shard_count=1,
        size_bytes=1,
        size_text="1 B",
        experts_kept=896,
        expert_quant="IQ1_S",
        dense_quant="Q4_K",
        imatrix=None,
        tensor_types={},
        mmproj=mmproj,
        vision=vision,  # type: ignore[arg-type]
        vision_note="",
        engines=("llama.cpp",),
    )


def test_vision_refusals_say_why() -> None:
    with pytest.raises(ImageError) as err:
        ensure_vision(False, where="http://127.0.0.1:8080")
    assert "http://127.0.0.1:8080 has no vision" in err.value.message
    with pytest.raises(ImageError) as err2:
        ensure_vision(True, where="x", tier=_tier((), "none"))
    assert "IQ1_S (p/Kimi-K3-GGUF) has no vision projector" in err2.value.message
    ensure_vision(True, where="x", tier=_tier(("mmproj-F16.gguf",), "fork"))
    ensure_vision(None, where="x")  # the server does not say: let it try
