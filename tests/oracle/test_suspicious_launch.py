"""A set b11434 refuses although its files are whole is flagged, not blocked.

``k3desk validate`` says why and exits 3; ``k3desk serve`` starts it anyway with
the warning shown, and the engine's own load is the final word: an engine that
loads it (the stand-in for a llama.cpp fork that uses the extra tensor) serves
it, and llama.cpp b11434 itself refuses it with its own message.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.oracle import gguf_edit as ge
from tests.oracle.llama import OracleSets
from tests.oracle.processes import k3desk, serving

FINDING = "holds tensor 'blk.0.foo.weight', which llama.cpp b11434's kimi-k3 loader does not use"


@pytest.fixture(scope="module")
def suspicious(oracle_sets: OracleSets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = ge.load(oracle_sets.quantized["Q4_K_M"])
    g = g.put(ge.Tensor("blk.0.foo.weight", (256,), 0, bytes(1024)))
    return ge.save(g, tmp_path_factory.mktemp("suspicious") / "Tiny-K3-Q4_K_M.gguf")


def test_validate_flags_it_and_says_it_can_still_be_launched(suspicious: Path) -> None:
    out = k3desk("validate", str(suspicious))
    assert out.returncode == 3
    assert "Tensors:      157" in out.stdout  # the layout is still shown
    lines = out.stderr.splitlines()
    assert lines[0].startswith("warning: ")
    assert FINDING in lines[0]
    assert lines[1].startswith("SUSPICIOUS: every part is whole")
    assert "`k3desk serve` starts it anyway" in lines[1]
    assert "Traceback" not in out.stderr


@pytest.mark.engine
def test_an_engine_that_loads_it_serves_it_with_the_warning_shown(
    suspicious: Path, fake_engine: Callable[..., Path]
) -> None:
    with serving(str(suspicious), "--ctx", "1024", "--engine", str(fake_engine("serve"))) as (
        _,
        facts,
    ):
        assert facts["URL"].startswith("http://127.0.0.1:")
        assert f"  - Warning: Tiny-K3-Q4_K_M.gguf {FINDING}" in facts["output"]


@pytest.mark.engine
def test_llama_cpp_b11434_refuses_it_itself(suspicious: Path, llama_server: Path) -> None:
    args = ("--ctx", "1024", "--engine", str(llama_server), "--max-restarts", "1")
    out = k3desk("serve", str(suspicious), *args)
    assert out.returncode == 1
    assert f"  - Warning: Tiny-K3-Q4_K_M.gguf {FINDING}" in out.stdout
    assert "error: llama-server failed" in out.stderr
    log = out.stderr.rsplit("See the log: ", 1)[-1].strip()
    assert "wrong number of tensors; expected 157, got 156" in Path(log).read_text()
