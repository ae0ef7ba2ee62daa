"""The shipped hardware files, and what a malformed one tells the user."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from k3desk.app import Services
from k3desk.core.errors import HardwareError
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.units import GiB
from tests.fixtures.hardware import HARDWARE_DIR

FILES = sorted(HARDWARE_DIR.glob("*.json"))
EXPECTED = {
    "8xH100-2TB",
    "1xRTX5090-256GB",
    "3xGB10-node",
    "epyc9554p-1.5TB-cpu",
    "8xA100-80GB",
    "512GB-ddr5-96GB-vram",
    "1xH200-141GB",
    "no-gpu-laptop-32GB",
}


def test_every_expected_file_is_shipped() -> None:
    assert {p.stem for p in FILES} >= EXPECTED


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_file_round_trips_exactly(path: Path) -> None:
    original = json.loads(path.read_text(encoding="utf-8"))
    profile = HardwareProfile.from_json_file(path)
    assert profile.source == str(path)
    again = json.loads(profile.to_json())
    assert again.pop("source") == str(path)
    assert original.pop("source") == "file"
    assert again == original
    # written in to_json's own layout
    expected_text = json.loads(path.read_text(encoding="utf-8"))
    assert json.dumps(expected_text, indent=2) == path.read_text(encoding="utf-8").rstrip("\n")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_file_numbers_are_usable_for_planning(path: Path) -> None:
    p = HardwareProfile.from_json_file(path)
    assert p.label
    assert p.memory.bandwidth.source in ("table", "estimate")
    assert p.memory.bandwidth.bytes_per_s > 0
    assert p.memory.bandwidth.note  # says how the number was made
    assert 0 < p.memory.available <= p.memory.total
    for g in p.gpus:
        assert g.bandwidth.source == "table"
        assert g.bandwidth.bytes_per_s > 0
        assert 0 < g.vram_free <= g.vram_total
    if not p.gpus:
        assert p.gpu_note


def test_figures_of_the_named_machines(hardware_file: Callable[[str], Path]) -> None:
    def load(name: str) -> HardwareProfile:
        return HardwareProfile.from_json_file(hardware_file(name))

    h100 = load("8xH100-2TB")
    assert len(h100.gpus) == 8
    assert {g.architecture for g in h100.gpus} == {"Hopper"}
    assert h100.total_vram == 8 * 81559 * 1024**2
    assert h100.cpu.sockets == 2

    h200 = load("1xH200-141GB")
    assert h200.gpus[0].architecture == "Hopper"  # not Blackwell, whatever a model card says
    assert h200.gpus[0].compute_capability == (9, 0)

    spark = load("3xGB10-node")
    (gb10,) = spark.gpus
    assert gb10.unified_memory
    assert gb10.compute_capability == (12, 1)
    assert spark.total_vram == 0
    assert "sve" in spark.cpu.flags
    assert not spark.cpu.has_avx2

    epyc = load("epyc9554p-1.5TB-cpu")
    assert epyc.gpus == ()
    assert epyc.memory.bandwidth.bytes_per_s == pytest.approx(460.8e9)
    assert (epyc.cpu.physical_cores, epyc.cpu.logical_cores) == (64, 128)

    rig = load("512GB-ddr5-96GB-vram")
    assert [g.name.split()[-1] for g in rig.gpus] == ["4090", "3090", "3090", "3090"]
    assert 95 * GiB < rig.total_vram < 97 * GiB
    assert rig.cpu.has_amx

    assert load("1xRTX5090-256GB").gpus[0].architecture == "Blackwell"
    assert load("8xA100-80GB").gpus[0].architecture == "Ampere"
    assert load("no-gpu-laptop-32GB").gpus == ()


def test_hardware_file_fixture_names_what_exists(hardware_file: Callable[[str], Path]) -> None:
    assert hardware_file("1xH200-141GB.json") == hardware_file("1xH200-141GB")
    with pytest.raises(LookupError, match="8xH100-2TB"):
        hardware_file("9xH900")


# ---------------------------------------------------------------- malformed files


def _good(hardware_file: Callable[[str], Path]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(hardware_file("1xH200-141GB").read_text())
    return data


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_not_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "machine.json"
    path.write_text("{ cpu: 8 cores", encoding="utf-8")
    with pytest.raises(HardwareError, match="not valid JSON") as err:
        HardwareProfile.from_json_file(path)
    assert str(path) in err.value.message
    assert "doctor --json" in err.value.hint


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="does not exist") as err:
        HardwareProfile.from_json_file(tmp_path / "nope.json")
    # says how to get one: from the machine itself, or an example shipped with k3desk
    assert "k3desk doctor --json > FILE" in err.value.hint
    assert "8xH100-2TB.json" in err.value.hint or "1xH200-141GB.json" in err.value.hint
    with pytest.raises(HardwareError, match="is a folder") as err:
        HardwareProfile.from_json_file(tmp_path)
    assert "k3desk doctor --json" in err.value.hint


def test_json_list_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="JSON object"):
        HardwareProfile.from_json_file(_write(tmp_path, [1, 2]))


def test_missing_section_is_named(tmp_path: Path, hardware_file: Callable[[str], Path]) -> None:
    data = _good(hardware_file)
    del data["memory"]
    with pytest.raises(HardwareError, match="missing field 'memory'") as err:
        HardwareProfile.from_json_file(_write(tmp_path, data))
    assert "machine.json" in err.value.message


def test_unknown_field_is_named(tmp_path: Path, hardware_file: Callable[[str], Path]) -> None:
    data = _good(hardware_file)
    data["gpus"][0]["vram"] = 5
    with pytest.raises(HardwareError, match="vram"):
        HardwareProfile.from_json_file(_write(tmp_path, data))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["memory"].__setitem__("total", "lots"), "memory.total"),
        (lambda d: d["memory"].__setitem__("available", -5), "memory.available"),
        (lambda d: d["cpu"].__setitem__("usable_cores", 0), "cpu.usable_cores"),
        (lambda d: d["gpus"][0].__setitem__("vram_total", 1.5e11), "gpus\\[0\\].vram_total"),
        (lambda d: d["gpus"][0].__setitem__("compute_capability", [9]), "compute_capability"),
        (lambda d: d["gpus"][0].__setitem__("compute_capability", ["nine", 0]), "nine"),
        (lambda d: d["memory"]["bandwidth"].__setitem__("source", "guess"), "source"),
        (lambda d: d["memory"]["bandwidth"].__setitem__("bytes_per_s", "fast"), "bytes_per_s"),
    ],
)
def test_wrong_values_are_named(
    tmp_path: Path,
    hardware_file: Callable[[str], Path],
    edit: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    data = _good(hardware_file)
    edit(data)
    with pytest.raises(HardwareError, match=message) as err:
        HardwareProfile.from_json_file(_write(tmp_path, data))
    assert "machine.json" in err.value.message
    assert err.value.hint


# ---------------------------------------------------------------- Services


def test_services_load_hardware_fills_only_missing_bandwidths(
    tmp_path: Path, hardware_file: Callable[[str], Path]
) -> None:
    data = _good(hardware_file)
    data["gpus"][0].pop("bandwidth")
    path = _write(tmp_path, data)
    profile = Services().load_hardware(path)
    assert profile.gpus[0].bandwidth.source == "table"
    assert profile.gpus[0].bandwidth.bytes_per_s == pytest.approx(4.8e12)
    # the file's own RAM figure is kept as written
    assert profile.memory.bandwidth.bytes_per_s == data["memory"]["bandwidth"]["bytes_per_s"]


def test_services_detect_hardware_is_cached_per_disk_path(tmp_path: Path) -> None:
    services = Services()
    a = services.detect_hardware(tmp_path / "a", measure_bandwidth=False)
    assert services.detect_hardware(tmp_path / "a", measure_bandwidth=False) is a
    b = services.detect_hardware(tmp_path / "b", measure_bandwidth=False)
    assert b is not a
    assert b.disk is not None
    assert b.disk.path == str(tmp_path / "b")
