"""The environment the engine really runs with, read from the running process."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from k3desk.core.engines.supervisor import LaunchSpec, RestartPolicy, Supervisor
from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import TinyModel

pytestmark = pytest.mark.engine


def test_a_local_engine_numbers_gpus_in_pci_order_like_the_plan(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    """The plan names GPUs in NVML's (PCI bus) order; CUDA numbers them fastest first unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID, so a mixed machine would get its -ts split on the wrong
    cards.  Read the variable from the llama-server process itself, not from our spec."""
    spec = LaunchSpec(
        llama_server,
        ("-m", str(tiny_k3_single.first_part), "-c", "256", "--no-warmup"),
        env={"K3DESK_TEST_MARK": "1"},
    )
    sup = Supervisor(spec, default_paths(), policy=RestartPolicy(stop_grace=5.0))
    try:
        sup.start()
        sup.wait_ready(120)
        assert sup.pid is not None
        env = psutil.Process(sup.pid).environ()
    finally:
        sup.stop()
    assert env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    assert env.get("K3DESK_TEST_MARK") == "1"  # the spec's own variables go along too
