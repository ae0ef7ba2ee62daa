"""Lay out what the SparkInfer stand-ins need on a loopback "node", as the recipe does.

- :func:`install_recipe` puts the stand-in recipe clone (``api-server/run-api.sh`` and
  ``server.py``, with ``api-server/.venv/bin/python``) where k3desk looks by default:
  ``<rank 0 workdir>/kimi-k3-neuron-tp3-dgxspark-recipe``.  Its ``.venv`` is a real
  Python environment with the bridge's requirements and ``transformers<5``
  (``.venv-bridge/transformers-4``, made by ``scripts/setup.sh --test``), as the recipe's
  QUICKSTART makes it;
- :func:`write_model_extras` writes what the recipe's step 1 puts on a node:
  ``k3_chat_template.jinja`` beside the shards (downloaded with them) and ``tokenizer/``
  beside the model folder ($K3_HOME/tokenizer, fetched from moonshotai/Kimi-K3).  The
  tokenizer folder is one that ``transformers.AutoTokenizer`` loads (``tokenizer.json``, a
  word-level vocabulary with K3's control tokens; ``tokenizer_config.json``;
  ``generation_config.json`` whose ``eos_token_id`` is ``<|end_of_msg|>``, as the real
  one's is), plus ``vocab.json`` (piece -> id, with ``<0xNN>`` byte pieces and ``▁``
  between words) for the stdlib stand-ins (bridge and rank 0).  The template renders K3's
  tagged format (llama.cpp b11434 ``models/templates/Kimi-K3.jinja``: ``<|open|>message
  role="user"<|sep|>...<|close|>message<|sep|><|end_of_msg|>``, then the generation
  prompt ``<|open|>message role="assistant"<|sep|><|open|>think<|sep|>`` or ``...response...``).
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from k3desk.core.cluster.sparkinfer import CHAT_TEMPLATE_NAME, RECIPE_DIRNAME, TOKENIZER_DIRNAME

REPO = Path(__file__).resolve().parents[3]
RECIPE = Path(__file__).resolve().parent / "recipe"
BRIDGE_ENVS = REPO / ".venv-bridge"  # scripts/setup.sh --test makes them
# K3's CONTROL tokens (the GGUF's vocabulary; see tests/fixtures/tiny's K3 models)
SPECIALS = ("[BOS]", "[EOS]", "[UNK]", "[PAD]", "<|open|>", "<|close|>", "<|sep|>",
            "<|end_of_msg|>", "\u2581")  # fmt: skip
TAGS = ("message", 'role="user"', 'role="assistant"', 'role="system"', "think", "response",
        "tools")  # fmt: skip
WORDS = ("Neuron", "TP3", "TP4", "stand-in", "heard:", "The", "user", "wrote", "something",
         ";", "answer", "nothing", "hello", "over", "three", "sparks", "what", "is", "here",
         "world")  # fmt: skip
TEMPLATE = (
    "{%- for m in messages -%}"
    "<|open|>message role=\"{{ m.role }}\"<|sep|>{{ m.content }}<|close|>message<|sep|>"
    "<|end_of_msg|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<|open|>message role=\"assistant\"<|sep|>"
    "<|open|>{{ 'think' if thinking else 'response' }}<|sep|>"
    "{%- endif -%}"
)

BRIDGE_ENV_HELP = """No Python environment for the SparkInfer bridge stand-in.

The recipe's bridge runs in api-server/.venv with its requirements and transformers<5;
the tests use real ones: run

  bash scripts/setup.sh --test

which makes .venv-bridge/transformers-4 and .venv-bridge/transformers-5 (see its end).
"""


def bridge_python(major: int = 4) -> Path:
    """The test environment with transformers ``major``.x (fails with instructions)."""
    python = BRIDGE_ENVS / f"transformers-{major}" / "bin" / "python"
    if not python.exists():
        import pytest

        pytest.fail(BRIDGE_ENV_HELP, pytrace=False)
    return python


def install_recipe(workdir: Path | str, *, python: Path | None = None) -> Path:
    """The stand-in recipe clone in ``workdir``; returns its folder.

    ``python``: what ``api-server/.venv/bin/python`` is (default: the transformers-4
    environment, which the recipe's bridge needs).
    """
    dest = Path(workdir) / RECIPE_DIRNAME
    shutil.copytree(RECIPE, dest, dirs_exist_ok=True)
    venv_bin = dest / "api-server" / ".venv" / "bin"
    venv_bin.mkdir(parents=True, exist_ok=True)
    # a script, not a symlink: a venv's python finds its packages from the path it was
    # started by (its pyvenv.cfg), so it must be started by its own path
    launcher = venv_bin / "python"
    if launcher.is_symlink() or launcher.exists():
        launcher.unlink()
    target = python or bridge_python(4)
    launcher.write_text(f'#!/bin/sh\nexec {shlex.quote(str(target))} "$@"\n')
    launcher.chmod(0o755)
    (dest / "api-server" / "run-api.sh").chmod(0o755)
    return dest


def vocabulary() -> dict[str, int]:
    pieces = [*SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *TAGS, *WORDS]
    return {p: i for i, p in enumerate(pieces)}


def _added(i: int, piece: str) -> dict[str, object]:
    return {"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}  # fmt: skip


def write_model_extras(model_dir: Path | str) -> tuple[Path, Path]:
    """``../tokenizer/vocab.json`` and ``k3_chat_template.jinja`` for ``model_dir``."""
    folder = Path(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = folder.parent / TOKENIZER_DIRNAME
    tokenizer.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    (tokenizer / "vocab.json").write_text(json.dumps(vocab))
    control = [p for p in SPECIALS if p != "\u2581"]
    hf = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added(vocab[p], p) for p in control],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    (tokenizer / "tokenizer.json").write_text(json.dumps(hf))
    (tokenizer / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "[BOS]",
             "eos_token": "[EOS]", "unk_token": "[UNK]", "pad_token": "[PAD]"}
        )
    )  # fmt: skip
    (tokenizer / "generation_config.json").write_text(
        json.dumps({"eos_token_id": vocab["<|end_of_msg|>"]})
    )
    template = folder / CHAT_TEMPLATE_NAME
    template.write_text(TEMPLATE)
    return tokenizer, template
