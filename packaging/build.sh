#!/usr/bin/env bash
# Build the one-folder desktop bundle: dist/k3desk/k3desk (run it, or
# `dist/k3desk/k3desk --install-desktop-entry` to add it to the menus).
#
#   packaging/build.sh            # uses the active Python environment
#   PYTHON=/path/to/python packaging/build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

"$PYTHON" -m pip install --quiet "pyinstaller>=6.10"
# icons are committed; re-render them only when the SVG is newer than a PNG
if [ resources/icons/k3desk.svg -nt resources/icons/hicolor/512x512/apps/k3desk.png ]; then
    QT_QPA_PLATFORM=offscreen "$PYTHON" packaging/render_icons.py
fi
"$PYTHON" -m PyInstaller --noconfirm --clean --distpath dist --workpath build/pyinstaller \
    packaging/k3desk.spec

# smoke test: the bundle answers as the CLI and finds its resources
dist/k3desk/k3desk --version
dist/k3desk/k3desk tiers --help > /dev/null
test -f dist/k3desk/_internal/resources/catalog.json || test -f dist/k3desk/resources/catalog.json
echo "Built dist/k3desk/ ($(du -sh dist/k3desk | cut -f1))."
