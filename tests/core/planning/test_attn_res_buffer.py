"""The compute-buffer estimate includes K3's AttnRes checkpoint stack, checked against the
real llama-server's own "compute buffer size" line for tiny models that differ only in
``kimi-k3.attn_res.block_size`` (src/models/kimi-k3.cpp: a checkpoint every block_size
layers; res_push concatenates, res_mix copies)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.engines.canary import write_k3_gguf
from k3desk.core.engines.supervisor import LaunchSpec, RestartPolicy, Supervisor
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.k3arch import TINY_K3
from k3desk.core.paths import default_paths
from k3desk.core.planning.memory import attn_res_stack_bytes
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.units import MiB

pytestmark = pytest.mark.engine

CTX, UBATCH, LAYERS = 1024, 512, 24
BUFFER = re.compile(r"CPU compute buffer size =\s+([\d.]+) MiB")


def test_the_attn_res_stack_is_in_the_estimate_as_the_engine_measures_it(
    llama_server: Path, tmp_path: Path, hardware_file
) -> None:  # type: ignore[no-untyped-def]
    hw = HardwareProfile.from_json_file(hardware_file("no-gpu-laptop-32GB"))
    sizes = (1, 3, LAYERS)  # 24, 8 and 1 checkpoints at the last layer
    layouts, sups = {}, {}
    for bs in sizes:
        shape = replace(TINY_K3, n_layer=LAYERS, attn_res_block_size=bs)
        model = write_k3_gguf(tmp_path / f"bs{bs}", f"bs{bs}", shape=shape, seed=3)[0]
        layouts[bs] = validate_shard_set(model)  # the block size as read from the file
        args = ("-m", str(model), "-c", str(CTX), "-ub", str(UBATCH), "-b", str(UBATCH),
                "-np", "1", "--no-warmup", "-lv", "4")  # fmt: skip
        spec = LaunchSpec(llama_server, args, ready_timeout=60)
        sups[bs] = Supervisor(spec, default_paths(), policy=RestartPolicy(max_failures=1))
    measured: dict[int, int] = {}
    try:
        for sup in sups.values():  # in parallel
            sup.start()
        for bs, sup in sups.items():
            sup.wait_ready()
            m = BUFFER.search(sup.log_file.read_text(errors="replace"))
            assert m, f"no compute buffer line in {sup.log_file}"
            measured[bs] = round(float(m.group(1)) * MiB)
    finally:
        for sup in sups.values():
            sup.stop()

    def estimate(bs: int) -> int:
        plan = make_plan(hw, layouts[bs], PlanOptions(ctx=CTX, ubatch=UBATCH))
        assert plan.verdict == "cpu"
        return next(d.compute for d in plan.devices if d.device == "RAM")

    assert layouts[1].hparams.attn_res_block_size == 1
    for bs in sizes:  # never less than llama.cpp reserves
        assert estimate(bs) >= measured[bs], (bs, estimate(bs), measured[bs])
    # per banked checkpoint the buffer grows as the engine's does (24 vs 8 checkpoints:
    # about 2.8 stacks' worth measured, 3 estimated), and never by more than estimated
    grew = measured[1] - measured[3]
    predicted = estimate(1) - estimate(3)
    assert 0.85 * predicted <= grew <= 1.05 * predicted, (grew, predicted)
    for bs in (1, 3):  # against one checkpoint: the allocator reuses a little of it
        grew = measured[bs] - measured[LAYERS]
        predicted = estimate(bs) - estimate(LAYERS)
        assert 0.7 * predicted <= grew <= 1.05 * predicted, (bs, grew, predicted)
    # without the stack, the estimate would fall short of what the engine allocates
    no_stack = estimate(1) - attn_res_stack_bytes(
        layouts[1].hparams, LAYERS - 1, ubatch=UBATCH, ctx=CTX
    )
    assert no_stack < measured[1]
