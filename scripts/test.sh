#!/usr/bin/env bash
# Set up everything and run the whole test suite, with the same gates CI applies.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
. .venv/bin/activate
export QT_QPA_PLATFORM=offscreen PYTHONDONTWRITEBYTECODE=1

echo "== ruff";          ruff check .
echo "== mypy";          mypy
echo "== import-linter"; lint-imports
echo "== core tests, with Qt made unimportable"
pytest -q -p tests.noqt -p no:pytestqt tests/core tests/test_layering.py
echo "== UI and end-to-end tests"
pytest -q tests --ignore=tests/core --deselect tests/test_layering.py
