"""No function in k3desk is over 80 lines: a longer one is split into named steps.

A table (a literal that is data, not steps) may run longer; each one goes in ``TABLES`` by
"path:name" with the reason.  The list is empty: no table is written as a function today.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT = 80  # lines, from ``def`` (decorators not counted) to the function's last line

# "k3desk/<path>.py:<function>": why it is a table and not steps
TABLES: dict[str, str] = {}


def long_functions(root: Path, base: Path = REPO) -> list[str]:
    """Every function and method under ``root`` over LIMIT lines and not a listed table,
    as "path:line name (n lines)" with the path relative to ``base``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(base).as_posix()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > LIMIT and f"{rel}:{node.name}" not in TABLES:
                found.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_over_80_lines() -> None:
    long = long_functions(REPO / "k3desk")
    assert not long, f"split these into named steps of at most {LIMIT} lines: " + ", ".join(long)


def test_the_check_finds_a_long_method_and_spares_a_short_one(tmp_path: Path) -> None:
    steps = "".join(f"        x{i} = {i}\n" for i in range(LIMIT - 1))
    (tmp_path / "k3desk").mkdir()
    (tmp_path / "k3desk" / "probe.py").write_text(
        "class Page:\n"
        "    def long(self) -> None:\n" + steps + "        x = 0\n"
        "\n"
        "    def fits(self) -> None:\n" + steps + "\n"
        "async def short() -> None:\n"
        "    pass\n",
        encoding="utf-8",
    )
    found = long_functions(tmp_path / "k3desk", tmp_path)
    assert found == [f"k3desk/probe.py:2 long ({LIMIT + 1} lines)"]
