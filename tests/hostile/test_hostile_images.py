"""Pictures that lie: truncated files, headers claiming billions of pixels, and
decompression bombs.  Each is judged here, by name, before anything is sent."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from k3desk.core.chat.images import MAX_SIDE, ImageError, load_image
from tests.hostile.conftest import StandIn, bounded, no_traceback, run_k3desk

MiB = 1024 * 1024


def noise(fmt: str, size: tuple[int, int] = (320, 240)) -> bytes:
    img = Image.frombytes(
        "RGB", size, bytes((i * 7919) % 251 for i in range(size[0] * size[1] * 3))
    )
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(side: int) -> bytes:
    """A valid side x side black RGB PNG, compressed about 1000:1, made a row at a time."""
    z = zlib.compressobj(9)
    row = b"\x00" + b"\x00" * (3 * side)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF"])
def test_a_truncated_picture_is_refused_here_by_name(fmt: str, tmp_path: Path) -> None:
    whole = noise(fmt)
    cut = tmp_path / f"cut.{fmt.lower()}"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(ImageError) as err:
        load_image(cut)
    assert f"{cut} starts like a {fmt} image but it is damaged (it cannot be decoded" in (
        err.value.message
    )
    assert "save it again" in err.value.hint
    (tmp_path / "whole").write_bytes(whole)
    sent = Image.open(io.BytesIO(load_image(tmp_path / "whole").data))
    assert sent.size == Image.open(io.BytesIO(whole)).size  # the whole one passes


def test_chat_with_a_truncated_picture_asks_nothing(standin: StandIn, tmp_path: Path) -> None:
    whole = noise("PNG")
    cut = tmp_path / "cut.png"
    cut.write_bytes(whole[:-200])
    r = run_k3desk("chat", "--url", standin.url, "--image", cut, "what is this?")
    assert r.returncode == 1
    no_traceback(r.stderr)
    assert "cut.png starts like a PNG image but it is damaged" in r.stderr.decode()
    assert standin.requests == []


def test_a_header_claiming_billions_of_pixels_is_refused_without_decoding(tmp_path: Path) -> None:
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    bomb = tmp_path / "claims.png"
    bomb.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IEND", b""))
    run = bounded(lambda: load_image(bomb), 10)
    assert isinstance(run.error, ImageError)
    assert "is 100000x100000 pixels (10000 megapixels); the limit is 64 megapixels" in (
        run.error.message
    )
    assert run.peak_rss_growth < 50 * MiB


def test_a_decompression_bomb_is_shrunk_in_bounded_memory(tmp_path: Path) -> None:
    """7000 x 7000 pixels (147 MB decoded) in a file of a few hundred KiB."""
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_bomb(7000))
    assert bomb.stat().st_size < 1 * MiB
    run = bounded(lambda: load_image(bomb), 30)
    assert run.error is None, run.error
    assert (run.value.width, run.value.height) == (MAX_SIDE, MAX_SIDE)
    assert run.value.resized
    # one decoded copy (147 MB) is the least a PNG decoder needs; not three of them
    assert run.peak_rss_growth < 260 * MiB, run.peak_rss_growth / MiB


def gif_with_a_frame(width: int, height: int) -> bytes:
    """A 16 x 16 GIF whose one frame claims ``width`` x ``height`` pixels (a few bytes of
    LZW data: the header is the whole attack)."""
    screen = b"GIF89a" + struct.pack("<HHBBB", 16, 16, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x4c\x01\x00"
    return screen + frame + b"\x3b"


def png_of(width: int, height: int, idat: bytes) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")
    )


def test_a_gif_frame_of_60000_squared_pixels_is_refused_by_name(tmp_path: Path) -> None:
    bomb = tmp_path / "frame.gif"
    bomb.write_bytes(gif_with_a_frame(60000, 60000))
    run = bounded(lambda: load_image(bomb), 10)
    assert isinstance(run.error, ImageError), run.error
    assert f"Image {bomb} has a frame of 60000x60000 pixels" in run.error.message
    assert run.peak_rss_growth < 50 * MiB


def test_an_idat_bomb_behind_a_small_header_is_refused(tmp_path: Path) -> None:
    """64 x 64 pixels need 12 KB; the IDAT inflates to 1 GiB (1 MB in the file).  It
    is refused after inflating a little more than 12 KB, and never reaches the engine."""
    z = zlib.compressobj(9)
    zeros = b"\x00" * MiB
    idat = b"".join(z.compress(zeros) for _ in range(1024)) + z.flush()
    bomb = tmp_path / "idat.png"
    bomb.write_bytes(png_of(64, 64, idat))
    assert bomb.stat().st_size < 2 * MiB
    run = bounded(lambda: load_image(bomb), 10)
    assert isinstance(run.error, ImageError), run.error
    assert "inflates to more than its 64x64 pixels need (12,352 bytes)" in run.error.message
    assert run.seconds < 5
    assert run.peak_rss_growth < 50 * MiB


def test_a_png_whose_idat_ends_early_is_refused(tmp_path: Path) -> None:
    """A complete zlib stream holding half the rows: Pillow pads it; the engine answers
    HTTP 400 mid-request.  It is refused here."""
    width, height = 40, 30
    rows = b"".join(b"\x00" + bytes([y]) * (3 * width) for y in range(height // 2))
    half = tmp_path / "half.png"
    half.write_bytes(png_of(width, height, zlib.compress(rows)))
    with pytest.raises(ImageError) as err:
        load_image(half)
    assert "it cannot be decoded: its pixel data ends early (1,815 of 3,630 bytes)" in (
        err.value.message
    )


def test_what_is_sent_is_encoded_again_from_the_decoded_picture(tmp_path: Path) -> None:
    """The file's own bytes never reach the engine: what does is a fresh encoding of
    every pixel (extra chunks, trailing data and metadata stay behind)."""
    whole = noise("PNG", (64, 48))
    extra = whole[:-12] + _chunk(b"tEXt", b"Comment\x00" + b"x" * 5000) + whole[-12:]
    picture = tmp_path / "with-extra.png"
    picture.write_bytes(extra + b"trailing bytes after IEND")
    sent = load_image(picture)
    assert sent.data != picture.read_bytes()
    assert b"Comment" not in sent.data
    assert b"trailing bytes" not in sent.data
    with Image.open(io.BytesIO(sent.data)) as a, Image.open(io.BytesIO(whole)) as b:
        assert a.tobytes() == b.convert(a.mode).tobytes()


def test_chat_with_an_idat_bomb_asks_nothing(standin: StandIn, tmp_path: Path) -> None:
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(b"\x00" * MiB) for _ in range(64)) + z.flush()
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_of(64, 64, idat))
    standin.props = {**standin.props, "modalities": {"vision": True}}
    r = run_k3desk("chat", "--url", standin.url, "--image", bomb, "what is this?", timeout=30)
    no_traceback(r.stderr)
    assert r.returncode == 1
    assert "a decompression bomb, refused" in r.stderr.decode()
    assert standin.requests == []
