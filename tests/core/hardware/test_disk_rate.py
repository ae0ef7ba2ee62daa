"""The disk's read rate: measured on the model's own data, from sysfs, or said to be unknown.

A streaming plan's seconds per token and every load time are divided by this figure,
so a plan on a hard disk that assumed an NVMe drive was wrong by an order of magnitude.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from k3desk.core.errors import HardwareError
from k3desk.core.hardware import disk_rate
from k3desk.core.hardware.disk_rate import (
    DiskRateStore,
    RateRecord,
    data_extents,
    device_of,
    largest_gguf,
    measure_read_rate,
    read_rate,
    table_read_rate,
)
from k3desk.core.hardware.profile import Bandwidth, DiskInfo, HardwareProfile
from k3desk.core.units import GB, MiB

REPO = Path(__file__).resolve().parents[3]


def _data_file(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 4 * MiB)
            f.write(os.urandom(n))
            left -= n
    return path


def _sparse_file(path: Path, apparent: int, data: int = 0) -> Path:
    with path.open("wb") as f:
        if data:
            f.write(os.urandom(data))
        f.truncate(apparent)
    return path


# ------------------------------------------------------------------ measuring


def test_a_file_with_data_is_timed_with_the_page_cache_bypassed(tmp_path: Path) -> None:
    f = _data_file(tmp_path / "part.gguf", 64 * MiB)
    m = measure_read_rate(f)
    assert m.why_not == ""
    assert m.bytes_read >= 32 * MiB  # enough to be a rate, not a latency
    assert m.bytes_per_s > 0
    assert m.cache_bypassed in ("O_DIRECT", "fadvise")


def test_a_sparse_file_is_not_timed_and_says_why(tmp_path: Path) -> None:
    """Holes cost no disk read: timing them would report the page allocator's speed
    as the disk's (a 528 GiB twin would 'read' at many GB/s)."""
    f = _sparse_file(tmp_path / "twin.gguf", 8 * GB, data=1 * MiB)
    m = measure_read_rate(f)
    assert m.bytes_per_s == 0
    assert "holes" in m.why_not
    assert "twin.gguf" in m.why_not


def test_a_small_file_is_not_timed(tmp_path: Path) -> None:
    f = _data_file(tmp_path / "tiny.gguf", 1 * MiB)
    m = measure_read_rate(f)
    assert m.bytes_per_s == 0
    assert "too small" in m.why_not


def test_an_unreadable_file_gives_a_reason_not_an_exception(tmp_path: Path) -> None:
    m = measure_read_rate(tmp_path / "missing.gguf")
    assert m.bytes_per_s == 0
    assert "missing.gguf cannot be opened" in m.why_not


def test_data_extents_skip_the_holes(tmp_path: Path) -> None:
    f = tmp_path / "holey"
    with f.open("wb") as out:
        out.write(b"x" * MiB)
        out.seek(64 * MiB)
        out.write(b"y" * MiB)
    fd = os.open(f, os.O_RDONLY)
    try:
        extents = data_extents(fd, f.stat().st_size)
    finally:
        os.close(fd)
    assert sum(e - s for s, e in extents) < 8 * MiB  # not the 65 MiB apparent size
    assert extents[0][0] == 0
    assert extents[-1][1] == 65 * MiB


def test_the_measured_file_is_the_one_with_the_most_data(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    _sparse_file(tmp_path / "a" / "twin-00001-of-00002.gguf", 4 * GB)
    real = _data_file(tmp_path / "b.gguf", 2 * MiB)
    _data_file(tmp_path / "notes.bin", 8 * MiB)
    assert largest_gguf(tmp_path) == real


# ------------------------------------------------------------------ sysfs


def _fake_sysfs(root: Path, target: Path, name: str, **files: str) -> None:
    """``root``/sys as Linux lays it out for the disk holding ``target``: the
    major:minor link points at the partition, whose parent is the disk."""
    st = os.stat(target)
    majmin = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    disk = root / "sys" / "devices" / "pci0000:00" / "block" / name
    part = disk / f"{name}p1"
    part.mkdir(parents=True)
    (part / "partition").write_text("1\n")
    (disk / "dev").write_text("259:0\n")
    for rel, text in files.items():
        p = disk / rel.replace("__", "/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    links = root / "sys" / "dev" / "block"
    links.mkdir(parents=True)
    (links / majmin).symlink_to(os.path.relpath(part, links))


def test_an_nvme_drive_is_rated_from_its_pcie_link(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _fake_sysfs(
        root,
        tmp_path,
        "nvme0n1",
        device__model="Samsung SSD 990 PRO 2TB\n",
        queue__rotational="0\n",
        device__device__current_link_speed="16.0 GT/s PCIe\n",
        device__device__current_link_width="4\n",
    )
    dev = device_of(tmp_path, root)
    assert dev is not None
    assert dev.name == "nvme0n1"
    assert dev.key.startswith("259:0 Samsung")
    rate = table_read_rate(tmp_path, "ext4", root)
    assert rate.source == "table"
    assert rate.bytes_per_s == pytest.approx(0.8 * 4 * 1.969e9, rel=1e-3)  # PCIe 4.0 x4
    assert "NVMe" in rate.note
    assert "Samsung" in rate.note


@pytest.mark.parametrize(
    ("name", "rotational", "source", "bps"),
    [
        ("sda", "1", "table", disk_rate.HDD_BPS),
        ("sda", "0", "table", disk_rate.SATA_SSD_BPS),
        ("mmcblk0", "0", "table", disk_rate.MMC_BPS),
        ("vda", "1", "unknown", 0.0),  # a virtual disk says rotational and means nothing
    ],
)
def test_other_devices(tmp_path: Path, name: str, rotational: str, source: str, bps: float) -> None:
    root = tmp_path / "root"
    _fake_sysfs(root, tmp_path, name, queue__rotational=rotational + "\n")
    rate = table_read_rate(tmp_path, "ext4", root)
    assert (rate.source, rate.bytes_per_s) == (source, bps)


def test_network_and_memory_file_systems(tmp_path: Path) -> None:
    assert table_read_rate(tmp_path, "nfs4").source == "unknown"
    assert table_read_rate(tmp_path, "tmpfs").bytes_per_s > 5 * GB


def test_no_block_device_is_unknown(tmp_path: Path) -> None:
    rate = table_read_rate(tmp_path, "ext4", tmp_path / "empty-root")
    assert rate.source == "unknown"
    assert rate.bytes_per_s == 0


# ------------------------------------------------------------------ kept per disk


def test_a_disk_is_measured_once_then_the_record_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    _fake_sysfs(root, tmp_path, "sda", queue__rotational="1\n")
    shard = _data_file(tmp_path / "m.gguf", 40 * MiB)
    store = DiskRateStore(tmp_path / "state")
    first = read_rate(shard, store, filesystem="ext4", root=root)
    assert first.source == "measured"
    assert first.bytes_per_s > 0

    def no_second_measurement(*_a: object, **_k: object) -> None:
        raise AssertionError("measured twice")

    monkeypatch.setattr(disk_rate, "measure_read_rate", no_second_measurement)
    again = read_rate(shard, store, filesystem="ext4", root=root)
    assert again.source == "measured"
    assert again.bytes_per_s == first.bytes_per_s
    assert (tmp_path / "state" / disk_rate.RATES_FILE).stat().st_mode & 0o077 == 0


def test_an_old_record_is_measured_again(tmp_path: Path) -> None:
    store = DiskRateStore(tmp_path, clock=lambda: 1e9 + disk_rate.MAX_AGE_S + 1)
    store.put(RateRecord("259:0 X", 2e9, 64 * MiB, "/m.gguf", 1e9))
    assert store.get("259:0 X") is None
    assert DiskRateStore(tmp_path, clock=lambda: 1e9 + 10).get("259:0 X") is not None


def test_a_damaged_record_file_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / disk_rate.RATES_FILE).write_text('{"schema": 1, "devices": [{"device": 3}]}')
    store = DiskRateStore(tmp_path)
    assert store.get("259:0 X") is None
    assert "damaged" in store.note
    store.put(RateRecord("259:0 X", 2e9, 64 * MiB, "/m.gguf", 1e11 - 1))
    assert json.loads((tmp_path / disk_rate.RATES_FILE).read_text())["devices"][0]["device"]


# ------------------------------------------------------------------ in a hardware file


def _profile_with_disk(rate: Bandwidth) -> HardwareProfile:
    base = HardwareProfile.from_json_file(
        REPO / "resources" / "hardware" / "no-gpu-laptop-32GB.json"
    )
    return base.with_disk(DiskInfo("/m", "/m", 10**12, 2 * 10**12, "ext4", read_rate=rate))


def test_the_read_rate_travels_in_the_hardware_file(tmp_path: Path) -> None:
    hw = _profile_with_disk(Bandwidth(0.2e9, "table", "spinning disk sda"))
    back = HardwareProfile.from_dict(json.loads(hw.to_json()), source="f")
    assert back.disk is not None
    assert hw.disk is not None
    assert back.disk.read_rate == hw.disk.read_rate
    bad = json.loads(hw.to_json())
    bad["disk"]["read_rate"]["bytes_per_s"] = -1
    with pytest.raises(HardwareError, match=r"disk\.read_rate\.bytes_per_s"):
        HardwareProfile.from_dict(bad, source="f")


def test_doctor_measures_the_models_folder_disk(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    _data_file(folder / "k3-00001-of-00002.gguf", 48 * MiB)
    env = dict(os.environ, K3DESK_HOME=str(tmp_path / "home"))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-m", "k3desk", "doctor", "--disk", str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    line = next(ln for ln in out.splitlines() if "Read rate" in ln)
    assert "GB/s (measured:" in line
    assert "k3-00001-of-00002.gguf" in line
    quick = subprocess.run(
        [sys.executable, "-m", "k3desk", "doctor", "--disk", str(tmp_path), "--no-benchmark"],
        env=dict(env, K3DESK_HOME=str(tmp_path / "home2")),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "measured" not in next(ln for ln in quick.splitlines() if "Read rate" in ln)


def test_the_record_keeps_the_64_disks_measured_last(tmp_path: Path) -> None:
    """One machine's record never grows past MAX_DEVICES disks: measuring a 65th drops
    the one measured longest ago, and the others keep their figures."""
    store = DiskRateStore(tmp_path, clock=lambda: 2e9)
    n = disk_rate.MAX_DEVICES + 6
    for i in range(n):
        store.put(RateRecord(f"8:{i} D{i}", 1e9 + i, 64 * MiB, f"/m{i}.gguf", 2e9 - 100 + i))
    kept = json.loads((tmp_path / disk_rate.RATES_FILE).read_text())["devices"]
    assert len(kept) == disk_rate.MAX_DEVICES == 64
    assert [store.get(f"8:{i} D{i}") for i in range(6)] == [None] * 6
    last = store.get(f"8:{n - 1} D{n - 1}")
    assert last is not None
    assert last.bytes_per_s == 1e9 + n - 1


def test_a_record_listing_more_disks_is_read_only_so_far(tmp_path: Path) -> None:
    """A record that lists 2,000 disks (written by hand, or grown by an old bug) is read
    as its first MAX_DEVICES: the disks after them are measured again, not trusted."""
    devices = [
        {"device": f"8:{i} D{i}", "bytes_per_s": 1e9, "bytes_read": 64 * MiB,
         "file": "/m.gguf", "when": 2e9 - 100}
        for i in range(2000)
    ]  # fmt: skip
    (tmp_path / disk_rate.RATES_FILE).write_text(json.dumps({"schema": 1, "devices": devices}))
    store = DiskRateStore(tmp_path, clock=lambda: 2e9)
    assert store.get("8:0 D0") is not None
    assert store.get("8:63 D63") is not None
    assert store.get("8:64 D64") is None
    assert store.get("8:1999 D1999") is None
    assert store.note == ""


def test_the_read_around_window_is_twice_the_devices_read_ahead(tmp_path: Path) -> None:
    """llama.cpp's POSIX_FADV_SEQUENTIAL doubles the window a page fault reads around."""
    root = tmp_path / "root"
    _fake_sysfs(root, tmp_path, "vda", queue__read_ahead_kb="8192\n")
    assert disk_rate.read_around_bytes(tmp_path, root) == 16 * 1024 * 1024
    assert disk_rate.read_around_bytes(tmp_path, tmp_path / "nothing") is None
