"""scripts/mutants.py: each mutant applies to the tree as it is, and a stale one is caught.

The mutation run itself takes minutes (scripts/mutants.py); this only checks that
every mutant's snippet still occurs exactly once, so a refactor that moves a promised
line makes its mutant fail here instead of silently scoring as an error later.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mutants() -> ModuleType:
    spec = importlib.util.spec_from_file_location("k3desk_mutants", REPO / "scripts" / "mutants.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_to_this_tree(mutants: ModuleType) -> None:
    assert len(mutants.MUTANTS) >= 30
    assert mutants.check(mutants.MUTANTS) == []


def test_a_snippet_that_moved_or_doubled_makes_its_mutant_stale(
    mutants: ModuleType, tmp_path: Path
) -> None:
    first = mutants.MUTANTS[0]
    (tmp_path / first.file).parent.mkdir(parents=True)
    for node in first.tests:
        (tmp_path / node.split("::")[0]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / node.split("::")[0], tmp_path / node.split("::")[0])
    source = (REPO / first.file).read_text(encoding="utf-8")
    target = tmp_path / first.file

    target.write_text(source, encoding="utf-8")
    assert mutants.check((first,), tmp_path) == []

    target.write_text(source.replace(first.find, first.find + "  # reworded"), encoding="utf-8")
    assert mutants.check((first,), tmp_path) == []  # still there once: still applies
    target.write_text(source.replace(first.find, "refactored()"), encoding="utf-8")
    assert mutants.check((first,), tmp_path) == [
        f"{first.name}: its snippet is not found in {first.file} (stale mutant)"
    ]
    target.write_text(source + "\n" + first.find + "\n", encoding="utf-8")
    assert mutants.check((first,), tmp_path) == [
        f"{first.name}: its snippet is found 2 times in {first.file} (stale mutant)"
    ]
    target.write_text(source, encoding="utf-8")
    (tmp_path / first.tests[0].split("::")[0]).unlink()
    assert "does not exist" in mutants.check((first,), tmp_path)[0]
    assert mutants.check((first, first), tmp_path)[0] == f"{first.name}: the name is used twice"
