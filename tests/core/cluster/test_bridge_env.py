"""The SparkInfer bridge's Python environment, checked by rendering one prompt as the
recipe's server.py does, against real environments: transformers 4.57 (what the bridge
needs) and 5.x (whose apply_chat_template(tokenize=True) returns a BatchEncoding), both
real venvs made by scripts/setup.sh --test, with a tokenizer folder AutoTokenizer loads.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3desk.core.cluster.bridge_env import TRANSFORMERS_SPEC, BridgeEnvReport, check_bridge_env
from k3desk.core.cluster.group import GroupState
from k3desk.core.errors import EngineError
from tests.core.cluster.test_sparkinfer import config_for, spark_nodes, supervisor
from tests.fakes.sparkinfer.stand_in import bridge_python, install_recipe, write_model_extras
from tests.fixtures.sshd import SshServer


def run_here(command: str, stdin: bytes) -> tuple[int, str, str]:
    p = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, timeout=120)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def check(tmp_path: Path, python: Path | str, *, fresh: bool = True) -> BridgeEnvReport:
    # the recipe's layout: the tokenizer beside the model folder, the template in it
    tokenizer = tmp_path / "tokenizer"
    template = tmp_path / "model" / "k3_chat_template.jinja"
    if fresh:
        assert write_model_extras(tmp_path / "model") == (tokenizer, template)
    return check_bridge_env(
        run_here,
        python=str(python),
        tokenizer_dir=str(tokenizer),
        chat_template=str(template),
        recipe_dir="/opt/recipe",
        where="rank 0 (spark0)",
    )


def test_transformers_4_renders_the_prompt(tmp_path: Path) -> None:
    report = check(tmp_path, bridge_python(4))
    assert report.ok, report.reason
    assert report.transformers.startswith("4.")
    # <|open|> message role="user" <|sep|> Hello <|close|> message <|sep|> <|end_of_msg|>, then
    # the generation prompt <|open|> message role="assistant" <|sep|> <|open|> response <|sep|>
    assert report.tokens == 16


def test_transformers_5_is_refused_with_the_reason_and_the_fix(tmp_path: Path) -> None:
    python = bridge_python(5)
    report = check(tmp_path, python)
    assert not report.ok
    assert report.transformers.startswith("5.")
    assert report.reason == (
        f"The bridge's Python on rank 0 (spark0) has transformers {report.transformers}, whose "
        "apply_chat_template(tokenize=True) returns a BatchEncoding, not the token-id list "
        "server.py needs: the bridge would refuse every request ('tokenizer did not return "
        "a token-id list')."
    )
    assert report.fix == (
        f"Install {TRANSFORMERS_SPEC!r} there (4.57 works): {python} -m pip install "
        f"'{TRANSFORMERS_SPEC}'"
    )


def test_a_python_without_the_bridge_s_packages(tmp_path: Path) -> None:
    report = check(tmp_path, sys.executable)  # k3desk's own venv: no fastapi, no transformers
    assert not report.ok
    assert report.reason.startswith(
        f"The bridge's Python {sys.executable} on rank 0 (spark0) lacks what server.py "
        "imports: fastapi (ModuleNotFoundError: No module named 'fastapi')"
    )
    assert report.fix == (
        "Install the bridge's requirements: "
        f"{sys.executable} -m pip install -r /opt/recipe/api-server/requirements.txt "
        f"'{TRANSFORMERS_SPEC}'"
    )


def test_no_python_environment_at_all(tmp_path: Path) -> None:
    report = check(tmp_path, "/opt/recipe/api-server/.venv/bin/python")
    assert not report.ok
    assert report.reason == (
        "The recipe's bridge has no Python environment on rank 0 (spark0): "
        "/opt/recipe/api-server/.venv/bin/python does not exist (run-api.sh stops with "
        "'API Python not found')."
    )
    assert report.fix == (
        "Create it once: python3 -m venv /opt/recipe/api-server/.venv && "
        "/opt/recipe/api-server/.venv/bin/pip install -r "
        f"/opt/recipe/api-server/requirements.txt '{TRANSFORMERS_SPEC}'"
    )


def test_a_tokenizer_folder_it_cannot_load(tmp_path: Path) -> None:
    tokenizer, _template = write_model_extras(tmp_path / "model")
    (tokenizer / "tokenizer.json").unlink()  # only the stand-ins' vocab.json is left
    report = check(tmp_path, bridge_python(4), fresh=False)
    assert not report.ok
    assert report.reason.startswith(
        "The bridge's Python on rank 0 (spark0) cannot load the tokenizer folder "
        "(AutoTokenizer.from_pretrained, as server.py does): "
    )


def test_a_launch_with_transformers_5_fails_at_once_and_says_why(sshd: SshServer) -> None:
    nodes = spark_nodes(sshd, "t5-")
    install_recipe(nodes[0].workdir, python=bridge_python(5))
    sup = supervisor(config_for(nodes, "t5"))
    t0 = time.monotonic()
    sup.start()
    with pytest.raises(EngineError) as err:
        sup.wait_ready(60)
    assert "whose apply_chat_template(tokenize=True) returns a BatchEncoding" in err.value.message
    assert err.value.message.startswith(
        "The SparkInfer cluster failed: The bridge's Python on rank 0 (t5-0) has transformers 5."
    )
    assert "-m pip install 'transformers>=4.45,<5'" in err.value.hint
    assert sup.state is GroupState.FAILED
    assert len(sup.attempts) == 1  # not retried: a restart cannot fix it
    assert sup.ranks == []  # no rank was started to load for minutes first
    assert time.monotonic() - t0 < 30
    sup.stop()
