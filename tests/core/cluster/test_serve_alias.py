"""``k3desk serve --cluster NAME --engine ...``: the issue's spelling of ``cluster serve``."""

from __future__ import annotations

import pytest

from k3desk.app import Services
from k3desk.cli import main


def k3(*argv: str) -> int:
    return main(list(argv), Services())


def add_three_nodes() -> None:
    nodes = [f"u@127.0.0.1:22,address=127.0.0.1,name=s{i}" for i in range(3)]
    assert k3("cluster", "add", "spark", *[a for n in nodes for a in ("--node", n)]) == 0


def test_serve_cluster_runs_the_cluster_serve_command(capsys: pytest.CaptureFixture[str]) -> None:
    add_three_nodes()
    capsys.readouterr()
    assert k3("cluster", "serve", "spark", "--engine", "sparkinfer", "--dry-run") == 0
    expected = capsys.readouterr().out
    assert "--rank 2 --world 3" in expected
    assert k3("serve", "--cluster", "spark", "--engine", "sparkinfer", "--dry-run") == 0
    assert capsys.readouterr().out == expected
    assert k3("serve", "--engine", "sparkinfer", "--cluster=spark", "--dry-run") == 0
    assert capsys.readouterr().out == expected


def test_serve_an_unknown_cluster_names_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    add_three_nodes()
    capsys.readouterr()
    assert k3("serve", "--cluster", "nope", "--engine", "rpc") == 1
    err = capsys.readouterr().err
    assert "There is no cluster named 'nope'" in err
    assert "spark" in err
    assert "Traceback" not in err
