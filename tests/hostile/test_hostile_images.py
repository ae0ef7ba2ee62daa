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
