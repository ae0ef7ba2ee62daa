"""Can the SparkInfer recipe's bridge work in its Python environment?  Render one prompt.

The recipe's bridge (vcruz305/kimi-k3-neuron-tp3-dgxspark-recipe, ``api-server/``) runs
``server.py`` with ``${K3_API_PYTHON:-api-server/.venv/bin/python}`` (``run-api.sh``).
Its ``requirements.txt`` asks for ``transformers>=4.45``, which today resolves to 5.x;
there ``tokenizer.apply_chat_template(..., tokenize=True)`` returns a ``BatchEncoding``,
and server.py's ``prompt_ids_for_request`` refuses every request with "tokenizer did not
return a token-id list".  transformers 4.57 returns the list it expects.

So the check does what server.py does for each request, once, with the bridge's own
interpreter, on rank 0: import what server.py imports (fastapi, pydantic, uvicorn,
transformers), load the tokenizer folder with ``AutoTokenizer.from_pretrained(dir,
trust_remote_code=True)`` (server.py ``_startup``), and render one user message with the
chat template, ``add_generation_prompt=True, thinking=False, tokenize=True``
(``prompt_ids_for_request``), which must give a list of ints.  Whatever fails is said
with its reason and the command that fixes it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k3desk.core.cluster.group import LaunchFailure
from k3desk.core.cluster.ssh import SshClient
from k3desk.core.progress import CancelToken

# what server.py's code needs: its own pin is transformers>=4.45, and 5.x breaks it
TRANSFORMERS_SPEC = "transformers>=4.45,<5"
BRIDGE_MODULES = ("fastapi", "pydantic", "uvicorn", "transformers")
MARK = "@@k3desk-bridge-env "
NO_PYTHON = "@@k3desk-bridge-env-no-python"

# Runs in the bridge's interpreter: python - TOKENIZER_DIR CHAT_TEMPLATE (stdlib + the
# bridge's own packages only); prints one MARK line of JSON.
CHECK_SCRIPT = r"""
import json, sys
out = {"python_version": sys.version.split()[0]}
def done(**kw):
    out.update(kw)
    print("@@k3desk-bridge-env " + json.dumps(out), flush=True)
    sys.exit(0)
missing = []
for name in MODULES:
    try:
        __import__(name)
    except Exception as e:
        missing.append("%s (%s: %s)" % (name, type(e).__name__, e))
try:
    import transformers
    out["transformers"] = transformers.__version__
except Exception:
    pass
if missing:
    done(ok=False, stage="import", missing=missing)
import os
tokenizer_dir, template_path = sys.argv[1], sys.argv[2]
if not os.path.isdir(tokenizer_dir) or not os.path.isfile(template_path):
    done(ok=False, stage="files", tokenizer=os.path.isdir(tokenizer_dir),
         template=os.path.isfile(template_path))
from transformers import AutoTokenizer
try:
    tok = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=True)
except Exception as e:
    done(ok=False, stage="tokenizer", error="%s: %s" % (type(e).__name__, e))
try:
    with open(template_path, encoding="utf-8") as f:
        template = f.read()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Hello"}], chat_template=template,
        add_generation_prompt=True, thinking=False, tokenize=True,
    )
except Exception as e:
    done(ok=False, stage="render", error="%s: %s" % (type(e).__name__, e))
if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
    done(ok=False, stage="render", returned=type(ids).__name__)
done(ok=True, tokens=len(ids))
""".replace("MODULES", repr(BRIDGE_MODULES))


@dataclass(frozen=True)
class BridgeEnvReport:
    """What the check found: ``ok``, else ``reason`` (why) and ``fix`` (a command)."""

    python: str
    ok: bool
    transformers: str = ""
    reason: str = ""
    fix: str = ""
    tokens: int = 0  # the rendered prompt's length

    def summary(self) -> str:
        if self.ok:
            return (
                f"the bridge's Python ({self.python}, transformers {self.transformers}) "
                f"renders a prompt ({self.tokens} tokens)"
            )
        return self.reason


def bridge_python(recipe_dir: str, env: Mapping[str, str]) -> str:
    """The interpreter run-api.sh uses: ``${K3_API_PYTHON:-$script_dir/.venv/bin/python}``."""
    return env.get("K3_API_PYTHON") or f"{recipe_dir.rstrip('/')}/api-server/.venv/bin/python"


def setup_command(recipe_dir: str, python: str | None = None) -> str:
    """What makes the bridge's environment as its code needs it (the recipe's own steps,
    with transformers held below 5)."""
    api = f"{recipe_dir.rstrip('/')}/api-server"
    req = shlex.quote(f"{api}/requirements.txt")
    pin = shlex.quote(TRANSFORMERS_SPEC)
    if python and python != f"{api}/.venv/bin/python":
        return f"{shlex.quote(python)} -m pip install -r {req} {pin}"
    venv = shlex.quote(f"{api}/.venv")
    return f"python3 -m venv {venv} && {venv}/bin/pip install -r {req} {pin}"


def check_command(python: str) -> str:
    """The shell command (the script on stdin; the two paths follow it as arguments)."""
    py = shlex.quote(python)
    return f'if [ ! -x {py} ]; then echo {NO_PYTHON}; exit 0; fi; exec {py} -'


def parse_report(
    python: str,
    returncode: int,
    stdout: str,
    stderr: str,
    *,
    recipe_dir: str,
    where: str,
    tokenizer_dir: str = "",
    chat_template: str = "",
) -> BridgeEnvReport:
    """The check's output, said for a person (``where``: the node, in words)."""
    fix = setup_command(recipe_dir, python)
    if NO_PYTHON in stdout:
        return BridgeEnvReport(
            python, False,
            reason=f"The recipe's bridge has no Python environment on {where}: {python} "
            "does not exist (run-api.sh stops with 'API Python not found').",
            fix=f"Create it once: {fix}",
        )  # fmt: skip
    line = next((x for x in stdout.splitlines() if x.startswith(MARK)), None)
    if line is None:
        last = (stderr.strip().splitlines() or [f"exit status {returncode}"])[-1]
        return BridgeEnvReport(
            python, False,
            reason=f"The bridge's Python {python} on {where} could not run the check: {last}",
            fix=f"Check that it is a working Python 3, or make the environment again: {fix}",
        )  # fmt: skip
    try:
        data = json.loads(line[len(MARK) :])
    except ValueError:
        data = {"ok": False, "stage": "output", "error": line}
    version = str(data.get("transformers") or "")
    if data.get("ok"):
        return BridgeEnvReport(python, True, version, tokens=int(data.get("tokens") or 0))
    return _failure(
        python,
        data,
        version,
        where=where,
        fix=fix,
        tokenizer_dir=tokenizer_dir,
        chat_template=chat_template,
    )


def _failure(
    python: str,
    data: dict[str, Any],
    version: str,
    *,
    where: str,
    fix: str,
    tokenizer_dir: str,
    chat_template: str,
) -> BridgeEnvReport:
    """The report of a check that ran and failed, by the stage it failed at."""
    stage = data.get("stage")
    if stage == "files":
        gone = [
            f"{what} {path}"
            for what, there, path in (
                ("tokenizer folder (K3_TOKENIZER_DIR)", data.get("tokenizer"), tokenizer_dir),
                ("chat template (K3_CHAT_TEMPLATE)", data.get("template"), chat_template),
            )
            if not there
        ]
        return BridgeEnvReport(
            python, False, version,
            reason=f"The recipe's bridge on {where} has no {' and no '.join(gone)}: "
            "run-api.sh stops with 'Tokenizer directory or chat-template file does not exist.'",
            fix="Rank 0 needs both: the recipe fetches the tokenizer from moonshotai/Kimi-K3 "
            "into $K3_HOME/tokenizer (beside the model folder) and keeps "
            "k3_chat_template.jinja with the shards. Put them there, or set where they are "
            "(--tokenizer-dir, --chat-template).",
        )  # fmt: skip
    if stage == "import":
        missing = ", ".join(data.get("missing") or ())
        return BridgeEnvReport(
            python, False, version,
            reason=f"The bridge's Python {python} on {where} lacks what server.py imports: "
            f"{missing}.",
            fix=f"Install the bridge's requirements: {fix}",
        )  # fmt: skip
    if stage == "tokenizer":
        return BridgeEnvReport(
            python, False, version,
            reason=f"The bridge's Python on {where} cannot load the tokenizer folder "
            f"(AutoTokenizer.from_pretrained, as server.py does): {data.get('error')}.",
            fix="Point K3_TOKENIZER_DIR at the model's native tokenizer folder (config.json, "
            "tokenization_kimi.py, tiktoken.model, tokenizer_config.json, "
            "generation_config.json); its code also needs tiktoken in the bridge's Python.",
        )  # fmt: skip
    returned = data.get("returned")
    if returned:
        return BridgeEnvReport(
            python, False, version,
            reason=f"The bridge's Python on {where} has transformers {version or '?'}, whose "
            f"apply_chat_template(tokenize=True) returns a {returned}, not the token-id list "
            "server.py needs: the bridge would refuse every request ('tokenizer did not "
            "return a token-id list').",
            fix=f"Install {TRANSFORMERS_SPEC!r} there (4.57 works): "
            f"{shlex.quote(python)} -m pip install {shlex.quote(TRANSFORMERS_SPEC)}",
        )  # fmt: skip
    return BridgeEnvReport(
        python, False, version,
        reason=f"The bridge's Python on {where} could not render a prompt with the chat "
        f"template (as server.py does for every request): {data.get('error')}.",
        fix="Check K3_CHAT_TEMPLATE (the k3_chat_template.jinja of this model) and the "
        f"bridge's requirements: {fix}",
    )  # fmt: skip


Runner = Callable[[str, bytes], tuple[int, str, str]]  # (command, stdin) -> rc, out, err


def check_bridge_env(
    run: Runner,
    *,
    python: str,
    tokenizer_dir: str,
    chat_template: str,
    recipe_dir: str,
    where: str,
) -> BridgeEnvReport:
    """Run the check with ``run`` (a command on the bridge's machine)."""
    command = f"{check_command(python)} {shlex.quote(tokenizer_dir)} {shlex.quote(chat_template)}"
    rc, out, err = run(command, CHECK_SCRIPT.encode())
    return parse_report(
        python, rc, out, err, recipe_dir=recipe_dir, where=where,
        tokenizer_dir=tokenizer_dir, chat_template=chat_template,
    )  # fmt: skip


def uses_recipe_bridge(argv: Sequence[str]) -> bool:
    """Whether the bridge command is the recipe's ``run-api.sh`` (the one this checks)."""
    return any(a.endswith("api-server/run-api.sh") for a in argv)


def require_bridge_env(
    client: SshClient,
    *,
    bridge_argv: Sequence[str],
    recipe_dir: str,
    env: Mapping[str, str],
    where: str,
    cancel: CancelToken | None = None,
) -> BridgeEnvReport | None:
    """Before a launch: check the recipe's bridge environment on rank 0 through ``client``
    (rank 0's); a failure is a fatal :class:`LaunchFailure` with the reason and the fix.
    None: the bridge is not the recipe's."""
    if not uses_recipe_bridge(bridge_argv):
        return None

    def run(command: str, stdin: bytes) -> tuple[int, str, str]:
        r = client.run(command, stdin=stdin, timeout=120.0, cancel=cancel)
        return r.returncode, r.text, r.error_text

    report = check_bridge_env(
        run,
        python=bridge_python(recipe_dir, env),
        tokenizer_dir=env.get("K3_TOKENIZER_DIR", ""),
        chat_template=env.get("K3_CHAT_TEMPLATE", ""),
        recipe_dir=recipe_dir,
        where=where,
    )
    if not report.ok:
        raise LaunchFailure(report.reason, report.fix, fatal=True)
    return report


__all__ = [
    "BRIDGE_MODULES",
    "CHECK_SCRIPT",
    "TRANSFORMERS_SPEC",
    "BridgeEnvReport",
    "bridge_python",
    "check_bridge_env",
    "require_bridge_env",
    "setup_command",
]
