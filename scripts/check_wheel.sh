#!/usr/bin/env bash
# Build k3desk's wheel, install it (not editable) into a clean venv and run it from there:
# `k3desk tiers --json`, `k3desk doctor --json` and the desktop app started offscreen.
# Catches what an editable checkout hides: data files left out of the wheel, undeclared
# dependencies, code that reads files through the source tree.
#   scripts/check_wheel.sh        (scripts/test.sh runs it; pip's cache makes it quick)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/k3wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$PY" -m pip wheel -q --no-deps -w "$work/dist" . 2>&1 | grep -v "^WARNING: Location" || true
wheel=$(ls "$work"/dist/k3desk-*.whl)
"$PY" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check "$wheel" 2>&1 | grep -v "^WARNING: Location" || true
"$work/venv/bin/python" -m pip check >/dev/null

# run from a folder that is not the checkout, so nothing can be imported from it
mkdir "$work/run"
cd "$work/run"
export K3DESK_HOME="$work/home" HF_HUB_OFFLINE=1 QT_QPA_PLATFORM=offscreen PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH K3DESK_RESOURCES
"$work/venv/bin/python" - "$work/venv/bin" <<'PY'
import json, os, subprocess, sys, time
from pathlib import Path

bin_dir = Path(sys.argv[1])
site = subprocess.run([bin_dir / "python", "-c", "import k3desk; print(k3desk.__file__)"],
                      capture_output=True, text=True, check=True).stdout.strip()
assert "site-packages" in site, f"k3desk imported from {site}, not from the wheel"

tiers = json.loads(subprocess.run([bin_dir / "k3desk", "tiers", "--json"], capture_output=True,
                                  text=True, check=True, timeout=120).stdout)
assert isinstance(tiers, dict) and tiers.get("tiers"), "k3desk tiers --json listed no tier"
doctor = json.loads(subprocess.run([bin_dir / "k3desk", "doctor", "--json"], capture_output=True,
                                   text=True, check=True, timeout=120).stdout)
assert doctor.get("memory", {}).get("total", 0) > 0, "k3desk doctor --json found no RAM"

out = subprocess.run([bin_dir / "k3desk-gui", "--help"], capture_output=True, text=True,
                     timeout=60, check=True).stdout
assert "usage: k3desk-gui" in out, out

home = Path(os.environ["K3DESK_HOME"])
(home / "config").mkdir(parents=True, exist_ok=True)
(home / "config" / "settings.json").write_text(json.dumps({"wizard_done": True}))
t0 = time.monotonic()
app = subprocess.Popen([bin_dir / "k3desk-gui", "--page", "chat"], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env={**os.environ, "K3DESK_AUTOMATION": "1"})
ready = {}
for line in app.stdout:
    if line.startswith("{"):
        ready = json.loads(line)
        break
if ready.get("event") != "ready":
    app.kill()
    sys.exit(f"the app from the wheel did not start:\n{app.stderr.read()[-3000:]}")
app.stdin.write('{"cmd": "errors"}\n{"cmd": "quit"}\n')
app.stdin.flush()
errors = json.loads(app.stdout.readline())["last"]
rc = app.wait(timeout=60)
assert rc == 0, f"the app exited with {rc}"
assert errors is None, f"the app showed an error: {errors}"
print(f"wheel: {len(tiers['tiers'])} tiers, doctor ok, app shown page "
      f"{ready.get('page')!r} in {time.monotonic() - t0:.1f} s")
PY
