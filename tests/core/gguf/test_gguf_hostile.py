"""Hostile GGUF headers: huge counts, scalar-vs-array per-layer keys, sparse files
with huge strings.  Each is refused by ``k3desk validate`` in a second or less and
64 MiB of memory at most, with one clear message, exit status 1 and no traceback.

Memory is the peak resident set of the real command in its own process; time is
that of the validation itself, in this process.  The files are built by
:mod:`tests.oracle.hostile`; several are sparse: a header that claims gigabytes
is a few kilobytes of real bytes around a hole.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from k3desk.core.engines.canary import write_k3_gguf
from k3desk.core.errors import ValidationError
from k3desk.core.gguf.validate import inspect_shard_set
from k3desk.core.k3arch import TINY_K3
from tests.oracle.hostile import HOSTILE, MAX_RSS, MAX_SECONDS, run_cli


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    (path,) = write_k3_gguf(tmp_path_factory.mktemp("tiny"), "Tiny-K3", shape=TINY_K3)
    return path


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_header_is_refused_fast_in_little_memory(
    kind: str, tiny: Path, tmp_path: Path
) -> None:
    build, expected = HOSTILE[kind]
    path = build(tiny, tmp_path)
    t0 = time.perf_counter()
    with pytest.raises(ValidationError) as err:
        inspect_shard_set(path)
    elapsed = time.perf_counter() - t0
    assert elapsed <= MAX_SECONDS, f"{kind}: {elapsed:.2f} s"
    assert expected in err.value.message, err.value.message
    rc, stdout, stderr, rss = run_cli(path)
    assert rc == 1
    assert stdout == ""
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 2, stderr  # the message and what to do
    assert lines[0] == f"error: {err.value.message}"
    assert lines[1].startswith("  ")
    assert rss <= MAX_RSS, f"{kind}: peak RSS {rss / 2**20:.1f} MiB"
    assert os.stat(path).st_blocks * 512 < 64 << 20  # sparse: the claims are not real bytes
