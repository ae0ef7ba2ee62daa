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
echo "== mutants: every promised line scripts/mutants.py breaks is still where it says"
python scripts/mutants.py --check
echo "== core and hostile-input tests, with Qt made unimportable"
# (pytest-qt is switched off there: its qt_api setting is then unknown, hence the -W)
python -m pytest -q -p tests.noqt -p no:pytest-qt \
  -W "ignore:Unknown config option:pytest.PytestConfigWarning" \
  tests/core tests/hostile tests/test_layering.py
echo "== llama.cpp as the oracle: sets its tools write, and its loader's verdicts"
python -m pytest -q -p tests.noqt -p no:pytest-qt \
  -W "ignore:Unknown config option:pytest.PytestConfigWarning" tests/oracle
echo "== the GPU checks, every step that needs no GPU (under 2 minutes on 2 cores)"
dc_work=$(mktemp -d)
bash scripts/device-check.sh --dry-run --work "$dc_work"
rm -rf "$dc_work"
echo "== UI and end-to-end tests"
python -m pytest -q tests --ignore=tests/core --ignore=tests/hostile --ignore=tests/oracle \
  --deselect tests/test_layering.py
echo "== the wheel, installed into a clean venv"
bash scripts/check_wheel.sh
