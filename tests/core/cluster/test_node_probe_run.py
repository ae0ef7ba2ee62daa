"""The programs the node probe starts on a cluster node (nvidia-smi, ``k3desk doctor``,
``k3desk validate``) run as ``k3desk.core.process.run`` runs them: their whole group ended
after a time-out, their output bounded; the probe starts nothing any other way."""

from __future__ import annotations

import ast
import subprocess
import time
from pathlib import Path

import pytest

from k3desk.core.cluster import node_probe
from k3desk.core.cluster.probe import PROBE_SCRIPT
from tests.processes import gone_within


def test_a_program_past_its_time_limit_is_ended_with_what_it_started(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; wait"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        node_probe._run(["sh", "-c", script], 1.0)
    assert time.monotonic() - t0 < 10
    assert gone_within(int(pids.read_text()), 5)


def test_a_program_that_floods_its_output_is_kept_to_the_bound() -> None:
    done = node_probe._run(["sh", "-c", "head -c 50000000 /dev/zero; echo err >&2"], 60)
    assert done.returncode == 0
    assert len(done.stdout) == node_probe.OUTPUT_LIMIT
    assert done.stderr == "err\n"


STARTERS = {"run", "Popen", "call", "check_call", "check_output", "system", "popen", "spawnv"}


def test_the_node_probe_starts_programs_only_through_its_run() -> None:
    """``subprocess`` is used in ``_run`` alone (what it guarantees holds for all)."""
    tree = ast.parse(PROBE_SCRIPT.read_text())
    users = {
        fn.name
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef)
        for node in ast.walk(fn)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("subprocess", "os")
        and node.func.attr in STARTERS
    }
    assert users == {"_run"}
