"""Lay out what the SparkInfer stand-ins need on a loopback "node", as the recipe does.

- :func:`install_recipe` puts the stand-in recipe clone (``api-server/run-api.sh`` and
  ``server.py``, with ``api-server/.venv/bin/python``) where k3desk looks by default:
  ``<rank 0 workdir>/kimi-k3-neuron-tp3-dgxspark-recipe``;
- :func:`write_model_extras` writes what the recipe's step 1 puts on a node:
  ``k3_chat_template.jinja`` beside the shards (downloaded with them) and ``tokenizer/``
  beside the model folder ($K3_HOME/tokenizer, fetched from moonshotai/Kimi-K3; here a
  word/byte ``vocab.json``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from k3desk.core.cluster.sparkinfer import CHAT_TEMPLATE_NAME, RECIPE_DIRNAME, TOKENIZER_DIRNAME

RECIPE = Path(__file__).resolve().parent / "recipe"
SPECIALS = ("<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<think>",
            "</think>", "\u2581")  # fmt: skip
WORDS = ("Neuron", "TP3", "TP4", "stand-in", "heard:", "The", "user", "wrote", "something",
         ";", "answer", "nothing", "hello", "over", "three", "sparks")  # fmt: skip
TEMPLATE = (
    "{%- for m in messages -%}<|im_{{ m.role }}|>{{ m.content }}<|im_end|>{%- endfor -%}"
    "<|im_assistant|><think>{%- if not thinking -%}</think>{%- endif -%}\n"
)


def install_recipe(workdir: Path | str) -> Path:
    """The stand-in recipe clone in ``workdir``; returns its folder."""
    dest = Path(workdir) / RECIPE_DIRNAME
    shutil.copytree(RECIPE, dest, dirs_exist_ok=True)
    venv_bin = dest / "api-server" / ".venv" / "bin"
    venv_bin.mkdir(parents=True, exist_ok=True)
    python = venv_bin / "python"
    if not python.exists():
        os.symlink("/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable,
                   python)  # fmt: skip
    (dest / "api-server" / "run-api.sh").chmod(0o755)
    return dest


def write_model_extras(model_dir: Path | str) -> tuple[Path, Path]:
    """``../tokenizer/vocab.json`` and ``k3_chat_template.jinja`` for ``model_dir``."""
    folder = Path(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = folder.parent / TOKENIZER_DIRNAME
    tokenizer.mkdir(parents=True, exist_ok=True)
    pieces = [*SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *WORDS]
    (tokenizer / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}))
    template = folder / CHAT_TEMPLATE_NAME
    template.write_text(TEMPLATE)
    return tokenizer, template
