"""``k3desk tune SHARD``: measure a few launch variants, keep the fastest for next time."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.engines import DECODE_TOKENS, PROMPT_TOKENS
from k3desk.core.app.values import Progress, ValidationError, what_is

if TYPE_CHECKING:
    from k3desk.core.app.services import Services


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tune",
        help="measure a few launch variants of a model and keep the fastest",
        description="Start llama-server on the model with a small set of launch variants "
        "(threads, batch sizes; on GPU machines --n-cpu-moe and the projector's place), "
        "time one short fixed request with each, and keep the fastest that fits for the "
        "next launch of this model on this machine.  Says what it gained over the plan's "
        "default and over llama.cpp's own defaults.",
    )
    p.add_argument("shard", type=Path, help="the model's first shard (...-00001-of-000NN.gguf)")
    p.add_argument("--mmproj", type=Path, metavar="FILE", help="vision projector, if used")
    p.add_argument("--ctx", type=int, metavar="N", help="context length (as for serve)")
    p.add_argument("--engine", type=Path, metavar="PATH", help="llama-server to use")
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=PROMPT_TOKENS,
        metavar="N",
        help=f"test prompt (default {PROMPT_TOKENS})",
    )
    p.add_argument(
        "--answer-tokens",
        type=int,
        default=DECODE_TOKENS,
        metavar="N",
        help=f"test answer (default {DECODE_TOKENS})",
    )
    p.add_argument(
        "--all", action="store_true", help="measure every variant (slow: the exhaustive sweep)"
    )
    p.add_argument("--no-save", action="store_true", help="measure and report, keep nothing")
    p.add_argument(
        "--forget", action="store_true", help="drop the settings kept for this model, then stop"
    )
    p.add_argument("--json", action="store_true", help="print the trials as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, services: Services) -> int:
    from k3desk.core.app.launch import (
        LocalLaunchRequest,
        TuneLaunchRequest,
        forget_tuned_launch,
        tune_local_launch,
    )

    shard = args.shard.expanduser()
    what = what_is(shard)
    if what:
        raise ValidationError(
            f"Model file {shard} does not exist." if what == "missing" else
            f"{shard} is {what}, not a model file.",
            "Pass the first shard (-00001-of-000NN.gguf).",
        )  # fmt: skip
    if args.ctx is not None and args.ctx < 256:
        raise ValidationError(f"--ctx {args.ctx} is too small; use at least 256.")

    if args.forget:
        gone = forget_tuned_launch(services, shard)
        print("Forgot the tuned settings." if gone else "No tuned settings were kept for it.")
        return 0

    def progress(p: Progress) -> None:
        if p.stage == "measure" and p.detail != "done":
            print(f"  [{p.done + 1}/{p.total}] {p.detail} ...", file=sys.stderr, flush=True)

    out = tune_local_launch(
        services,
        TuneLaunchRequest(
            LocalLaunchRequest(
                shard,
                mmproj=args.mmproj,
                ctx=args.ctx,
                engine=args.engine,
                configured_engine=services.configured_engine(),
            ),
            prompt_tokens=args.prompt_tokens,
            decode_tokens=args.answer_tokens,
            exhaustive=args.all,
            save=not args.no_save,
        ),
        on_progress=progress,
    )
    if args.json:
        data = out.to_dict()
        print(json.dumps(data, indent=2, default=lambda x: None))
        return 0
    for line in out.lines():
        print(line)
    return 0
