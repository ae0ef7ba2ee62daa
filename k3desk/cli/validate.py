"""``k3desk validate SHARD [--json]``: check a downloaded shard set from its headers.

Exit status: 0 when llama.cpp b11434 loads the set; 1 when no llama.cpp build can
(a missing or cut part, a corrupt header, a file that contradicts itself); 3 when
b11434 refuses a set whose files are whole ("suspicious": an engine built from
another llama.cpp checkout may load it, and ``k3desk serve`` still starts it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3desk.core.app.shards import REFERENCE, ModelLayout, inspect_shard_set
from k3desk.core.app.values import CatalogError, ValidationError, fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.services import Services
    from k3desk.core.app.values import Tier


SUSPICIOUS = 3  # exit status of a set the reference engine refuses though its files are whole


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "validate",
        help="check a Kimi-K3 GGUF shard set (headers only) and show its layout",
        description="Check every part of a Kimi-K3 GGUF shard set by reading only its "
        "headers (a few megabytes, under a second) against the rules of llama.cpp b11434's "
        "loader, and show its layer layout. Any one part, or an unsplit .gguf, will do. "
        "Exit status: 0 loads, 1 broken, 3 suspicious (b11434 refuses it, another "
        "engine may not).",
    )
    p.add_argument("shard", type=Path, help="any part of the set, e.g. ...-00001-of-00094.gguf")
    p.add_argument("--json", action="store_true", help="print the layout as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, services: Services) -> int:
    tiers: tuple[Tier, ...] = ()
    # the catalog only improves the advice in error messages
    with contextlib.suppress(CatalogError):
        tiers = services.catalog.tiers
    try:
        report = inspect_shard_set(args.shard, tiers=tiers)
    except ValidationError as exc:
        if not args.json:
            raise
        print(json.dumps({"ok": False, "error": exc.message, "hint": exc.hint}, indent=2))
        return 1
    if args.json:
        data = {
            "ok": report.loads_in_reference,
            **layout_json(report.layout),
            "notes": list(report.notes),
            "suspicious": list(report.suspicious),
        }
        print(json.dumps(data, indent=2))
        return 0 if report.loads_in_reference else SUSPICIOUS
    for line in summary_lines(report.layout):
        print(line)
    for note in report.notes:
        print(f"note: {note}")
    if report.suspicious:
        for finding in report.suspicious:
            print(f"warning: {finding}", file=sys.stderr)
        print(
            f"SUSPICIOUS: every part is whole, but {REFERENCE} refuses this set for the "
            "reason above. An engine built from another llama.cpp checkout may load it: "
            "`k3desk serve` starts it anyway, shows this warning, and the engine's own load "
            "decides.",
            file=sys.stderr,
        )
        return SUSPICIOUS
    print(f"OK: every part is present and consistent; {REFERENCE} loads this set.")
    return 0


def _ranges(indices: list[int]) -> str:
    """``[1,2,3,5]`` -> ``"1-3, 5"``."""
    out: list[str] = []
    start = prev = None
    for i in indices:
        if start is None:
            start = prev = i
        elif prev is not None and i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ", ".join(out)


def summary_lines(layout: ModelLayout) -> list[str]:
    hp = layout.hparams
    moe = layout.moe_layers
    dense = [lay.index for lay in layout.layers if lay.ffn == "dense"]
    mla = [lay.index for lay in layout.layers if lay.attention == "mla"]
    kda = len(layout.layers) - len(mla)
    pattern = "".join("M" if lay.attention == "mla" else "K" for lay in layout.layers)
    types = ", ".join(
        f"{name} {n:,}" for name, n in sorted(layout.type_counts.items(), key=lambda kv: -kv[1])
    )
    first = layout.parts[0]
    lines = [
        f"Model:        {layout.name or first.name}  [{layout.architecture}]",
        f"Parts:        {len(layout.parts)} in {first.parent}, starting {first.name}",
        f"On disk:      {fmt_bytes(layout.total_file_bytes)} ({layout.total_file_bytes:,} bytes)",
        f"Tensors:      {layout.tensor_count:,} ({types})",
        f"Layers:       {hp.block_count}: {len(dense)} dense lead ({_ranges(dense)}) "
        f"+ {len(moe)} MoE",
        f"Attention:    {kda} KDA + {len(mla)} MLA (MLA at {_ranges(mla)})",
        f"  pattern:    {pattern}  (K = KDA, M = MLA)",
        f"Experts:      {hp.expert_count} per MoE layer, {hp.expert_used_count} used per token, "
        f"FFN width {hp.expert_feed_forward_length}, latent {hp.expert_latent_length}, "
        f"{hp.expert_shared_count} shared",
    ]
    # per-layer expert bytes, grouped by equal values
    groups: dict[int, list[int]] = {}
    for lay in moe:
        groups.setdefault(lay.expert_bytes, []).append(lay.index)
    for n, (size, idx) in enumerate(sorted(groups.items(), key=lambda kv: kv[1][0])):
        label = "Expert bytes: " if n == 0 else "              "
        lines.append(f"{label}{fmt_bytes(size)} per layer (layers {_ranges(idx)})")
    non_expert = layout.total_tensor_bytes - layout.expert_bytes
    lines += [
        f"  all layers: {fmt_bytes(layout.expert_bytes)} of routed experts",
        f"Non-expert:   {fmt_bytes(non_expert)} (attention, shared experts, norms, router; "
        f"globals {fmt_bytes(layout.global_bytes)}, of which token_embd "
        f"{fmt_bytes(layout.token_embd_bytes)})",
        f"Total:        {fmt_bytes(layout.total_tensor_bytes)} of tensor data",
        f"Context:      {hp.context_length:,} tokens max; vocabulary {hp.vocab_size:,}",
    ]
    return lines


def layout_json(layout: ModelLayout) -> dict[str, Any]:
    hp = layout.hparams
    return {
        "name": layout.name,
        "architecture": layout.architecture,
        "parts": [str(p) for p in layout.parts],
        "part_sizes": list(layout.part_sizes),
        "total_file_bytes": layout.total_file_bytes,
        "total_tensor_bytes": layout.total_tensor_bytes,
        "expert_bytes": layout.expert_bytes,
        "non_expert_bytes": layout.total_tensor_bytes - layout.expert_bytes,
        "global_bytes": layout.global_bytes,
        "token_embd_bytes": layout.token_embd_bytes,
        "tensor_count": layout.tensor_count,
        "type_counts": layout.type_counts,
        "hparams": {**hp.__dict__, "head_count_kv": list(hp.head_count_kv)},
        "layers": [
            {
                "index": lay.index,
                "attention": lay.attention,
                "ffn": lay.ffn,
                "expert_bytes": lay.expert_bytes,
                "other_bytes": lay.other_bytes,
            }
            for lay in layout.layers
        ],
    }
