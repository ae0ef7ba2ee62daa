#!/usr/bin/env bash
# Set up k3desk and open the desktop app.  Extra arguments go to k3desk.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/k3desk "$@"
