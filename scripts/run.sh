#!/usr/bin/env bash
# Set up k3desk and open the desktop app.  Extra arguments go to k3desk.
# The setup (system libraries, pip) runs only when .venv is missing or pyproject.toml,
# setup.py, scripts/setup.sh or the venv's Python changed since the last one
# (scripts/stamp.sh); K3DESK_SETUP=1 runs it anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=$(bash scripts/stamp.sh 2>/dev/null || true)
if [ "${K3DESK_SETUP:-0}" = 1 ] || [ -z "$stamp" ] || [ ! -x .venv/bin/k3desk ] \
   || [ "$(cut -d' ' -f1 .venv/.k3desk-setup 2>/dev/null)" != "$stamp" ]; then
  bash scripts/setup.sh
fi
exec .venv/bin/k3desk "$@"
