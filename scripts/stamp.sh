#!/usr/bin/env bash
# Print what ./.venv was last set up from: the hash of pyproject.toml, setup.py and
# scripts/setup.sh, with the venv's Python version.  scripts/setup.sh writes it to
# .venv/.k3desk-setup when it is done; scripts/run.sh skips the setup (no pip run)
# while it still matches.  The package is installed editable, so changes to the code
# itself need no setup.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || exit 1
{
  cat pyproject.toml setup.py scripts/setup.sh 2>/dev/null
  .venv/bin/python -c 'import sys; print(sys.version)'
} | sha256sum | cut -d' ' -f1
