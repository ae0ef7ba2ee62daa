"""The model card's SparkInfer command, which does not exist, and what to run instead."""

from __future__ import annotations

import re

from k3desk.core.cluster.recipe import (
    DEFAULT_PROFILE,
    LAUNCHER_MAX_CTX,
    PROFILES,
)
from k3desk.core.cluster.sparkinfer_config import (
    BINARY,
    CHAT_TEMPLATE_NAME,
    TARGET_REPO,
    reply_caps,
    tokenizer_command,
)

# Steps 6 and 7 of the model card's launch procedure, as printed there.
CARD_COMMAND = (
    "sparkinfer --model ./Kimi-K3-UD-IQ1_S --tp 3 --rank 0 --listen --ctx-len 8192 --jdba-band\n"
    "sparkinfer --model ./Kimi-K3-UD-IQ1_S --tp 3 --rank 1 --coord <rank0-host>:9000 --jdba-band"
)


# ------------------------------------------------------------------ the card's command

_CARD_FIXES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), text)
    for p, text in (
        (
            r"(^|\s)sparkinfer(\s|$)",
            f"There is no `sparkinfer` program: the binary is `{BINARY}` (built from "
            "gittensor-ai-lab/sparkinfer-k3 v0.2.2 with the recipe's patch chain, "
            "-DSPARKINFER_TP=ON and NCCL).",
        ),
        (
            r"--tp\b",
            "`--tp N` does not exist: give `--world 3` (or 4) and a `--rank R` on each node.",
        ),
        (r"--ctx-len\b", "`--ctx-len` does not exist: the flag is `--max-ctx N`."),
        (
            r"--jdba-band\b",
            "`--jdba-band` does not exist: the closest setting is the environment variable "
            "SPARKINFER_K3_DIST_HEAD_BAND=1 on every rank.",
        ),
        (
            r":9000\b",
            "Nothing listens on port 9000: workers connect with `--coord IP:29500` (the "
            "coordinator port), the serve socket is 29600 (a line protocol, not HTTP), and "
            "the OpenAI-compatible HTTP comes from the bridge on port 8000.",
        ),
        (
            r"--listen(\s+--|\s*$)",
            "`--listen` needs an address: `--listen <rank-0 IPv4>:29500` (IPv4 literals only).",
        ),
        (
            r"--model\s+\S*Kimi-K3-UD-IQ1_S/?(\s|$)",
            "`--model` takes the first shard file, not the folder: "
            "`--model /path/Kimi-K3-UD-IQ1_S-00001-of-00009.gguf`.",
        ),
    )
)


def explain_card_command(command: str = CARD_COMMAND) -> str:
    """What is wrong with a command copied from the model card, and the verified one."""
    lines = ["The model card's SparkInfer command does not match the program:"]
    found = [text for rx, text in _CARD_FIXES if rx.search(command)]
    if not found:
        lines = ["That command has none of the model card's known mistakes."]
    lines += [f"  - {t}" for t in found]
    profile = PROFILES[DEFAULT_PROFILE]
    env = " ".join(f"{k}={v}" for k, v in profile.env.items())
    flags = " ".join(profile.args())
    shard = "/k3/model/Kimi-K3-UD-IQ1_S-00001-of-00009.gguf"
    cap, default = reply_caps(LAUNCHER_MAX_CTX)
    lines += [
        "",
        "The verified command line, as the recipe's scripts/k3_cluster.sh starts it (one "
        "process per node, rank 0 first, each with the same environment):",
        f"  every rank:  {env} LD_LIBRARY_PATH=<dist>",
        f"  rank 0:  {BINARY} --rank 0 --world 3 --listen 10.0.0.11:29500 --model {shard} "
        f"--max-ctx {LAUNCHER_MAX_CTX} --serve 127.0.0.1:29600 {flags}",
        f"  rank 1:  {BINARY} --rank 1 --world 3 --coord 10.0.0.11:29500 --model {shard} "
        f"--max-ctx {LAUNCHER_MAX_CTX} {flags}",
        "  rank 2:  the same with --rank 2",
        "  then the recipe's HTTP bridge beside rank 0 (port 8000, model kimi-k3-neuron):",
        "           K3_TOKENIZER_DIR=/k3/tokenizer "
        f"K3_CHAT_TEMPLATE=/k3/model/{CHAT_TEMPLATE_NAME} K3_SERVE_PORT=29600 "
        f"K3_MAX_CONTEXT_TOKENS={LAUNCHER_MAX_CTX} K3_MAX_TOKENS={cap} "
        f"K3_DEFAULT_MAX_TOKENS={default} K3_API_KEY=<a long random secret> "
        "api-server/run-api.sh",
        f"  (the chat template comes with the shards from {TARGET_REPO}; the tokenizer "
        f"does not: `{tokenizer_command('/k3/tokenizer')}`).",
        "Every node needs its own complete copy of the 9 shards at the same path.  "
        "`--spec-draft K` (2..16) must be on every rank, with SPARKINFER_K3_PREFILL_CHUNK "
        "(64 when unset) >= K.",
        "`k3desk cluster serve NAME --engine sparkinfer` runs all of this for you.",
    ]
    return "\n".join(lines)
