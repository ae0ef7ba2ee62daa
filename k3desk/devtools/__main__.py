"""``python -m k3desk.devtools COMMAND ...``: dispatch to a developer tool."""

from __future__ import annotations

import importlib
import sys

TOOLS = {
    "twin": "k3desk.devtools.twin",
    "tiny-k3": "k3desk.devtools.tinyk3",
    "bench-k3": "k3desk.devtools.benchk3",
    "real-bytes": "k3desk.devtools.realbytes",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in TOOLS:
        print("usage: python -m k3desk.devtools {" + ",".join(TOOLS) + "} ...", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(TOOLS[argv[0]])
    return int(module.main(argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
