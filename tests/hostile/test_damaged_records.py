"""k3desk's own records, damaged or replaced by something hostile: a named pipe, a link
to /dev/zero, 170 MB, a list where an object belongs, a pid of -1 or 1e400, a time in
the year 30000, a ratio that shows "here ~inf", a tuned ``-t 100000``.

Each is read in bounded time and memory, set aside (renamed ``.damaged-TIME``, so
nothing is lost) with a sentence that says so, and never trusted."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from k3desk.core.app import background
from k3desk.core.app.background import BackgroundEngine
from k3desk.core.app.services import Services
from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import TierRequest, judge_tiers
from k3desk.core.catalog.model import Tier
from k3desk.core.cluster.endpoints import EndpointStore
from k3desk.core.cluster.nodes import ClusterError
from k3desk.core.engines.probe import CACHE_FILE, cached_probe
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.hardware.ram_rate import RECORD_FILE as RAM_RECORD
from k3desk.core.hardware.ram_rate import RamBandwidthStore
from k3desk.core.paths import AppPaths, default_paths
from k3desk.core.planning.estimate import estimate_layout
from k3desk.core.planning.model import PlanOptions
from k3desk.core.settings import SettingsError, SettingsStore
from k3desk.core.tuning.calibration import CalibrationStore, SpeedRecord
from k3desk.core.tuning.identity import machine_key, model_key
from k3desk.core.tuning.tuned import TunedChoice, TunedStore, apply_tuned
from tests.conftest import REPO
from tests.hostile.conftest import (
    NOT_A_FILE,
    bounded,
    k3desk_env,
    no_traceback,
    run_k3desk,
)

MiB = 1024 * 1024
HARDWARE = REPO / "resources" / "hardware" / "epyc9554p-1.5TB-cpu.json"


# ------------------------------------------------------------ what is put there


def a_list(path: Path) -> None:
    path.write_text("[1, 2, 3]\n")


def nan(path: Path) -> None:
    path.write_text('{"schema": 1, "records": NaN, "machines": NaN, "endpoints": NaN}\n')


GENERIC = {**NOT_A_FILE, "a list": a_list, "NaN": nan}


# ------------------------------------------------------------ the stores


def _paths() -> AppPaths:
    return default_paths().ensure()


def _machine() -> HardwareProfile:
    return replace(Services().load_hardware(HARDWARE), source="detected")


def _tier() -> Tier:
    return next(t for t in Services().catalog.tiers if t.experts_kept >= 8)


def read_keep_running(paths: AppPaths) -> tuple[object, str]:
    return background.take_up(paths)


def read_calibration(paths: AppPaths) -> tuple[object, str]:
    store = CalibrationStore(paths.state)
    return store.records() or None, store.note


def read_tuned(paths: AppPaths) -> tuple[object, str]:
    store = TunedStore(paths.state)
    layout = estimate_layout(_tier())
    options, note = apply_tuned(store, _machine(), layout, PlanOptions())
    return (options if note else None), store.note


def read_probe_cache(paths: AppPaths) -> tuple[object, str]:
    engine = paths.cache / "llama-server"
    engine.write_bytes(b"#!/bin/sh\n")
    return cached_probe(engine, paths), ""


def read_ram_bandwidth(paths: AppPaths) -> tuple[object, str]:
    store = RamBandwidthStore(paths.state)
    return store.get(machine_key(_machine())), store.note


def read_endpoints(paths: AppPaths) -> tuple[object, str]:
    try:
        return EndpointStore(paths).load() or None, ""
    except ClusterError as exc:
        return None, exc.message


def read_settings(paths: AppPaths) -> tuple[object, str]:
    try:
        return SettingsStore(paths.settings_file).load(), ""
    except SettingsError as exc:
        return None, exc.message


STORES: dict[str, tuple[Callable[[AppPaths], Path], Callable[[AppPaths], tuple[object, str]]]] = {
    "keep-running record": (background.record_path, read_keep_running),
    "measured speeds": (lambda p: p.state / "speed-measured.json", read_calibration),
    "tuned launch": (lambda p: p.state / "tuned-launch.json", read_tuned),
    "probe cache": (lambda p: p.cache / CACHE_FILE, read_probe_cache),
    "RAM bandwidth": (lambda p: p.state / RAM_RECORD, read_ram_bandwidth),
    "endpoints": (lambda p: p.config / "endpoints.json", read_endpoints),
    "settings": (lambda p: p.settings_file, read_settings),
}


@pytest.mark.parametrize("damage", list(GENERIC))
@pytest.mark.parametrize("store", list(STORES))
def test_a_damaged_record_is_set_aside_in_bounded_time_and_memory(store: str, damage: str) -> None:
    paths = _paths()
    where, read = STORES[store]
    path = where(paths)
    path.parent.mkdir(parents=True, exist_ok=True)
    GENERIC[damage](path)

    run = bounded(lambda: read(paths), 10)

    assert run.error is None, f"{type(run.error).__name__}: {run.error}"
    assert run.peak_rss_growth < 256 * MiB, run.peak_rss_growth / MiB
    value, message = run.value
    assert value is None
    settings_json_mistake = store in ("settings", "endpoints") and damage in ("a list", "NaN")
    if settings_json_mistake:
        # a person's own configuration with a JSON mistake is left for them to fix
        assert f"{path} cannot be read" in message or "must hold a JSON object" in message
        assert os.path.lexists(path)
        return
    if store == "probe cache":  # a cache: set aside quietly, asked again
        message = ""
    else:
        assert str(path) in message, message
        assert "damaged" in message, message
    set_aside = list(path.parent.glob(f"{path.name}.damaged-*"))
    assert len(set_aside) == 1
    assert not os.path.lexists(path)


def _keep(paths: AppPaths, **fields: object) -> Path:
    me = os.getpid()
    record = {**asdict(BackgroundEngine(me, me, 8080, "key", "Tiny", 1.7e9)), **fields}
    path = background.record_path(paths)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record).replace("Infinity", "1e400"))
    return path


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("pid", -1, "pid -1 is outside 1-"),
        ("pid", float("inf"), "pid must be a whole number"),  # 1e400 in the file
        ("keeper_pid", 2**40, "keeper_pid 1099511627776 is outside 1-"),
        ("port", 70000, "port 70000 is outside 1-65535"),
        ("since", "yesterday", "since must be a number"),
        ("api_key", ["a", "list"], "api_key must be text"),
        ("address", "javascript:alert(1)", "address must be http://host:port"),
        ("address", "http://127.0.0.1:80 --api-key x", "address must be http://host:port"),
    ],
)
def test_a_forged_keep_running_record_is_named_and_set_aside(
    field: str, value: object, words: str
) -> None:
    paths = _paths()
    path = _keep(paths, **{field: value})
    run = bounded(lambda: background.take_up(paths), 10)
    assert run.error is None, run.error
    rec, why = run.value
    assert rec is None
    assert words in why, why
    assert "was damaged" in why
    assert not path.exists()


def _speed(hw: HardwareProfile, tier: Tier, **fields: object) -> dict[str, object]:
    layout = estimate_layout(tier)
    good = SpeedRecord(
        when=1_700_000_000.0, machine=machine_key(hw), model=model_key(layout),
        model_label=Path(tier.first_shard).name, kind="cpu", threads=8,
        predicted_decode=10.0, predicted_prompt=0.0, measured_decode=5.0,
        measured_prompt=0.0, decode_tokens=64, prompt_tokens=0,
    )  # fmt: skip
    return {**asdict(good), **fields}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"when": 1e300}, "when 1e+300 is not a time"),
        ({"when": "soon"}, "when must be a time"),
        ({"predicted_decode": 1e-300, "measured_decode": 9e6}, "not a ratio a real run gives"),
        ({"threads": "eight"}, "threads must be a whole number"),
    ],
)
def test_absurd_measured_speeds_never_reach_the_tier_table(
    fields: dict[str, object], words: str
) -> None:
    paths = _paths()
    hw, services = _machine(), Services()
    tier = next(
        r.tier
        for r in judge_tiers(TierRequest(hw, Subject.this_machine(hw)), services.catalog.tiers).rows
        if r.kind == "cpu" and r.speed is not None
    )
    store = CalibrationStore(paths.state)
    store.path.write_text(json.dumps({"schema": 1, "records": [_speed(hw, tier, **fields)]}))

    def table() -> list[str]:
        request = TierRequest(hw, Subject.this_machine(hw), state_dir=paths.state)
        rows = judge_tiers(request, services.catalog.tiers).rows
        return [r.speed.text() for r in rows if r.speed is not None]

    run = bounded(table, 10)
    assert run.error is None, f"{type(run.error).__name__}: {run.error}"
    assert not any("inf" in t or "nan" in t for t in run.value), run.value
    assert not any("here" in t for t in run.value)  # nothing from the damaged file
    assert len(list(paths.state.glob("speed-measured.json.damaged-*"))) == 1

    store.path.write_text(json.dumps({"schema": 1, "records": [_speed(hw, tier, **fields)]}))
    assert store.records() == []
    assert words in store.note, store.note


def test_a_tuned_thread_count_beyond_this_machine_is_not_launched() -> None:
    paths = _paths()
    hw, layout = _machine(), estimate_layout(_tier())
    store = TunedStore(paths.state)
    choice = TunedChoice(100_000, None, None, None, None, None, "-t 100000", 0.5, 1.7e9)
    store.put(hw, layout, choice)
    options, note = apply_tuned(store, hw, layout, PlanOptions())
    assert (options.threads, note) == (None, "")
    fits = replace(choice, threads=hw.cpu.logical_cores, label=f"-t {hw.cpu.logical_cores}")
    store.put(hw, layout, fits)
    options, note = apply_tuned(store, hw, layout, PlanOptions())
    assert options.threads == hw.cpu.logical_cores
    assert "measured fastest" in note


@pytest.mark.parametrize("damage", ["fifo", "link to /dev/zero"])
def test_the_cli_says_the_calibration_file_was_set_aside_and_ends(damage: str) -> None:
    paths = _paths()
    path = paths.state / "speed-measured.json"
    GENERIC[damage](path)
    r = run_k3desk("tiers", timeout=30, env=k3desk_env())
    no_traceback(r.stderr)
    assert r.returncode == 0, r.stderr.decode()
    assert f"The file of measured speeds {path} was damaged (it is " in r.stderr.decode()
    assert not os.path.lexists(path)
