"""Node descriptions that ssh could never use are refused when the cluster is added."""

from __future__ import annotations

import pytest

from k3desk.app import Services
from k3desk.cli import main
from k3desk.core.cluster.nodes import parse_node_spec


def test_a_stray_bracket_in_a_host_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "add", "c1", "--node", "user@[bad"], Services()) == 1
    err = capsys.readouterr().err
    assert "host '[bad' is not a host name or address" in err
    assert "[fd00::2]:22" in err
    assert "Traceback" not in err
    assert main(["cluster", "list"], Services()) == 0
    assert "No clusters" in capsys.readouterr().out  # nothing was saved


def test_a_bracketed_ipv6_host_is_fine() -> None:
    node = parse_node_spec("user@[fd00::2]:2222")
    assert (node.host, node.port) == ("fd00::2", 2222)
    assert node.problems() == []
