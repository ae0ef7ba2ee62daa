"""``k3desk cluster``: machines beyond this one.

k3desk cluster add NAME --node [user@]host[:port][,key=value...] ...
k3desk cluster list | remove NAME
k3desk cluster probe NAME [--tier ID] [--engine sparkinfer|rpc] [--sha256] [--json]
k3desk cluster serve NAME --engine sparkinfer|rpc [...]
k3desk cluster explain-card ["COMMAND"]
k3desk cluster endpoint add|list|remove|check ...
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from k3desk.core.app.chat import DIALECT_IDS, DIALECTS
from k3desk.core.app.clusters import (
    DEFAULT_PROFILE,
    LAUNCHER_MAX_CTX,
    PROFILES,
    SPARKINFER_TIER,
    Cluster,
    ClusterError,
    ClusterStore,
    GroupEvent,
    GroupPolicy,
    GroupState,
    GroupSupervisor,
    NodeReport,
    ShardSetSpec,
    add_cluster,
    cluster_store,
    launch_config,
    plan_cluster,
    probe_nodes,
    spec_draft_note,
    start_group,
)
from k3desk.core.app.endpoints import (
    EndpointRequest,
    add_endpoint,
    check_endpoint,
    endpoint_store,
    remove_endpoint,
    set_endpoint_server,
)
from k3desk.core.app.values import Progress, fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.clusters import RecipeProfile
    from k3desk.core.app.services import Services
    from k3desk.core.app.values import Tier

RPC_CTX = 8192


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cluster",
        help="clusters of machines over SSH: inventory, probe, SparkInfer / llama.cpp RPC, "
        "remote endpoints",
        description="Describe machines k3desk reaches with ssh (keys only, never passwords), "
        "probe their GPUs, memory, disk and model copies, and run Kimi-K3 across them with "
        "SparkInfer (TP3/TP4 on DGX Spark) or llama.cpp RPC workers.",
    )
    p.set_defaults(handler=lambda a, s: _help(p))
    cs = p.add_subparsers(dest="cluster_command", metavar="ACTION")
    _add_parser(cs)
    _list_and_remove_parsers(cs)
    _probe_parser(cs)
    _serve_parser(cs)
    _explain_parser(cs)
    _endpoint_parsers(cs)


def _add_parser(cs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """cluster add"""
    a = cs.add_parser("add", help="describe a cluster (its nodes)")
    a.add_argument("name")
    a.add_argument(
        "--node",
        action="append",
        required=True,
        metavar="SPEC",
        help="[user@]host[:port][,address=IP][,identity=KEY][,model=DIR][,workdir=DIR]"
        "[,name=LABEL][,sparkinfer=PATH][,rpc=PATH][,python=PATH][,k3desk=CMD] "
        "(repeat for every node; rank 0 first)",
    )
    a.add_argument("--user", default="", help="ssh user for nodes that do not name one")
    a.add_argument("--identity", default="", metavar="KEY", help="private key for every node")
    a.add_argument("--model-path", default="", metavar="DIR", help="model folder on every node")
    a.add_argument("--workdir", default="", metavar="DIR", help="working folder on every node")
    a.add_argument("--replace", action="store_true", help="overwrite a cluster of that name")
    a.add_argument(
        "--check", action="store_true", help="log in to every node now (learns host keys)"
    )
    a.set_defaults(handler=run_add)


def _list_and_remove_parsers(cs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """cluster list, cluster remove"""
    ls = cs.add_parser("list", help="list clusters and attached endpoints")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=run_list)

    rm = cs.add_parser("remove", help="forget a cluster")
    rm.add_argument("name")
    rm.set_defaults(handler=run_remove)


def _probe_parser(cs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """cluster probe"""
    pr = cs.add_parser("probe", help="hardware, engines and model copy on every node")
    pr.add_argument("name")
    pr.add_argument("--tier", help="check each node's copy of this tier (catalog id)")
    pr.add_argument("--engine", choices=("sparkinfer", "rpc"), help="also plan for this engine")
    pr.add_argument("--ctx", type=int, default=8192, help="context for the plan (default 8192)")
    pr.add_argument(
        "--hashes-from",
        type=Path,
        metavar="DIR",
        help="check sizes (and with --sha256, hashes) against this machine's download of the "
        "tier in DIR",
    )
    pr.add_argument("--sha256", action="store_true", help="hash the files (slow) when known")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(handler=run_probe)


def _serve_parser(cs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """cluster serve"""
    sv = cs.add_parser(
        "serve",
        help="run Kimi-K3 across the cluster and keep every process running",
        description="SparkInfer: start rank 0, the workers and the HTTP bridge over ssh. "
        "RPC: start an rpc-server on every node and llama-server --rpc here. Every process is "
        "watched; when one dies all are restarted together. Ctrl-C stops everything.",
    )
    sv.add_argument("name")
    sv.add_argument("--engine", choices=("sparkinfer", "rpc"), required=True)
    sv.add_argument("--tier", help=f"catalog tier (SparkInfer: only {SPARKINFER_TIER})")
    sv.add_argument(
        "--model",
        help="SparkInfer: shard 1's file name in each node's model folder; "
        "RPC: the first shard on this machine",
    )
    sv.add_argument(
        "--ctx",
        type=int,
        help=f"--max-ctx / -c (default: SparkInfer {LAUNCHER_MAX_CTX}, as the recipe's launcher; "
        f"RPC {RPC_CTX})",
    )
    _sparkinfer_serve_options(sv)
    sv.add_argument("--rpc-port", type=int, default=50052, help="RPC worker port (default 50052)")
    sv.add_argument("--bind", action="append", default=[], metavar="NODE=ADDR")
    sv.add_argument("--allow-public", action="store_true", help="allow wildcard/public RPC binds")
    sv.add_argument("--server", type=Path, metavar="PATH", help="llama-server to use (RPC)")
    sv.add_argument("--no-probe", action="store_true", help="skip the hardware/copy probe")
    sv.add_argument("--force", action="store_true", help="start despite refusals (SparkInfer)")
    sv.add_argument("--dry-run", action="store_true", help="print the commands, start nothing")
    sv.add_argument(
        "--check",
        action="store_true",
        help="start, send one short chat, stop everything and report (a smoke test)",
    )
    sv.add_argument("--max-restarts", type=int, default=3, help="failures in a row (default 3)")
    sv.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for ready")
    sv.set_defaults(handler=run_serve)


def _sparkinfer_serve_options(sv: argparse.ArgumentParser) -> None:
    """cluster serve: drafting, profile, environment, ports and bridge (SparkInfer's, the
    environment and ports also RPC's)."""
    sv.add_argument(
        "--spec-draft",
        type=int,
        metavar="K",
        help="SparkInfer: speculative draft width instead of the profile's (0 = no drafting)",
    )
    sv.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        choices=list(PROFILES),
        help="SparkInfer: the recipe's launch profile (environment and drafter flags on every "
        "rank): "
        + "; ".join(f"{p.name} = {p.title}, {p.note}" for p in PROFILES.values())
        + f" (default {DEFAULT_PROFILE})",
    )
    sv.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="extra env on every rank"
    )
    sv.add_argument("--coord-port", type=int, default=29500)
    sv.add_argument("--serve-port", type=int, default=29600)
    sv.add_argument("--bridge-port", type=int, default=8000)
    sv.add_argument(
        "--bridge-cmd",
        metavar="ARGV",
        help="SparkInfer bridge command line instead of the recipe's api-server/run-api.sh "
        "(placeholders {python} {workdir} {recipe} {engine} {host} {port} {model} {ctx} "
        "{tokenizer} {template}; the K3_* environment is set as for run-api.sh)",
    )
    sv.add_argument(
        "--recipe-dir",
        metavar="DIR",
        help="SparkInfer: the recipe's clone on rank 0 "
        "(default <rank 0 workdir>/kimi-k3-neuron-tp3-dgxspark-recipe)",
    )
    sv.add_argument(
        "--tokenizer-dir",
        metavar="DIR",
        help="SparkInfer: the model's tokenizer folder on rank 0 (default <model>/tokenizer)",
    )
    sv.add_argument(
        "--chat-template",
        metavar="FILE",
        help="SparkInfer: k3_chat_template.jinja on rank 0 "
        "(default <model>/k3_chat_template.jinja)",
    )


def _explain_parser(cs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """cluster explain-card"""
    ex = cs.add_parser(
        "explain-card", help="what is wrong with the model card's SparkInfer command"
    )
    ex.add_argument("command", nargs="?", help="the command you copied (default: the card's)")
    ex.set_defaults(handler=run_explain)


def _endpoint_parsers(cs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """cluster endpoint add, set, list, remove, check"""
    ep = cs.add_parser("endpoint", help="attach OpenAI-compatible servers (vLLM, bridges, ...)")
    eps = ep.add_subparsers(dest="endpoint_command", metavar="ACTION")
    ep.set_defaults(handler=lambda a, s: _help(ep))
    ea = eps.add_parser("add", help="attach a URL (checked now)")
    ea.add_argument("name")
    ea.add_argument("url")
    key = ea.add_mutually_exclusive_group()
    key.add_argument("--key", help="API key (saved in the system keyring)")
    key.add_argument("--key-env", metavar="VAR", default="", help="read the key from $VAR")
    ea.add_argument("--model", default="", help="model id to send (default: the server's)")
    ea.add_argument("--no-check", action="store_true", help="do not contact it now")
    ea.add_argument("--replace", action="store_true")
    _server_options(ea)
    ea.set_defaults(handler=run_endpoint_add)
    es = eps.add_parser("set", help="say what kind of server an endpoint is (or auto)")
    es.add_argument("name")
    es.add_argument("--server", required=True, choices=SERVER_CHOICES, metavar="KIND",
                    help=f"one of {', '.join(SERVER_CHOICES)}")  # fmt: skip
    es.set_defaults(handler=run_endpoint_set)
    el = eps.add_parser("list", help="list attached endpoints")
    el.add_argument("--json", action="store_true")
    el.set_defaults(handler=run_endpoint_list)
    er = eps.add_parser("remove", help="detach an endpoint (and forget its key)")
    er.add_argument("name")
    er.set_defaults(handler=run_endpoint_remove)
    ec = eps.add_parser("check", help="is it up, and what does it serve")
    ec.add_argument("name")
    ec.set_defaults(handler=run_endpoint_check)


SERVER_CHOICES = ("auto", *DIALECT_IDS)


def _server_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        choices=SERVER_CHOICES,
        default="auto",
        metavar="KIND",
        help=f"what kind of server it is: {', '.join(SERVER_CHOICES)} (default: k3desk finds "
        "out from /props, /healthz and /readyz, /version)",
    )
    p.add_argument(
        "--max-tokens-limit",
        type=int,
        metavar="N",
        help="the most tokens it generates per answer (a bridge's K3_MAX_TOKENS)",
    )
    p.add_argument(
        "--context-limit",
        type=int,
        metavar="N",
        help="its context, prompt and answer (a bridge's K3_MAX_CONTEXT_TOKENS)",
    )


def _help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def _store(services: Services) -> ClusterStore:
    return cluster_store(services)


# ------------------------------------------------------------------ add / list / remove


def run_add(args: argparse.Namespace, services: Services) -> int:
    defaults = {
        "user": args.user,
        "identity": args.identity,
        "model_path": args.model_path,
        "workdir": args.workdir,
    }
    cluster, store = add_cluster(
        services, args.name, args.node, defaults=defaults, replace_existing=args.replace
    )
    nodes = cluster.nodes
    print(f"Saved cluster {args.name!r} with {len(nodes)} node(s) in {store.file}.")
    if args.check:
        from k3desk.core.app.clusters import SshClient, SshError

        failed = 0
        for n in nodes:
            try:
                host = SshClient(n, store.known_hosts).check()
                print(f"  {n.label}: ok (logged in to {host})")
            except SshError as exc:
                failed += 1
                print(f"  {n.label}: {exc.message}\n    {exc.hint}")
        return 1 if failed else 0
    return 0


def run_list(args: argparse.Namespace, services: Services) -> int:
    clusters = _store(services).load()
    endpoints = endpoint_store(services).load()
    if args.json:
        print(
            json.dumps(
                {
                    "clusters": [c.to_dict() for c in clusters],
                    "endpoints": [
                        {"name": e.name, "url": e.url, "model": e.model} for e in endpoints
                    ],
                },
                indent=2,
            )
        )
        return 0
    if not clusters and not endpoints:
        print("No clusters or endpoints yet: `k3desk cluster add NAME --node user@host ...`.")
        return 0
    for c in clusters:
        print(f"{c.name} ({len(c.nodes)} nodes)")
        for n in c.nodes:
            extra = f" address {n.address}" if n.address else ""
            model = f" model {n.model_path}" if n.model_path else ""
            print(f"  {n.label:<20} ssh {n.destination}:{n.port}{extra}{model}")
    for e in endpoints:
        print(f"endpoint {e.name}: {e.url}" + (f" ({e.model})" if e.model else ""))
    return 0


def run_remove(args: argparse.Namespace, services: Services) -> int:
    cluster = _store(services).remove(args.name)
    print(f"Removed cluster {cluster.name!r} ({len(cluster.nodes)} nodes).")
    return 0


# ------------------------------------------------------------------ probe


def _tier(services: Services, tier_id: str) -> Tier:
    return services.catalog.get(tier_id)


def _progress(p: Progress) -> None:
    if p.detail:
        print(f"  [{p.done}/{p.total}] {p.detail}", file=sys.stderr)


def _describe(rep: NodeReport) -> list[str]:
    if not rep.ok:
        return [f"{rep.node.label}: unreachable or failed", f"    {rep.error}"]
    hw = rep.hardware
    assert hw is not None
    lines = [f"{rep.node.label} ({hw.hostname or rep.node.host}, probe: {rep.method})"]
    if hw.gpus:
        for g in hw.gpus:
            mem = "unified with RAM" if g.unified_memory else fmt_bytes(g.vram_total)
            lines.append(f"    GPU {g.index}: {g.name} ({g.architecture}, sm_{g.sm}), {mem}")
    else:
        lines.append(f"    GPUs: none ({hw.gpu_note or 'no NVIDIA GPU'})")
    lines.append(
        f"    RAM: {fmt_bytes(hw.memory.total)} total, {fmt_bytes(hw.memory.available)} available"
    )
    if hw.disk is not None:
        lines.append(f"    disk: {fmt_bytes(hw.disk.free)} free at {hw.disk.probed_path}")
    if rep.engines:
        lines.append("    engines: " + ", ".join(f"{k} ({v})" for k, v in rep.engines.items()))
    if rep.copy is not None:
        lines.append(f"    model copy: {rep.copy.summary()}")
    if rep.paths:
        lines.append("    files: " + ", ".join(f"{k} ({v})" for k, v in rep.paths.items()))
    if rep.note:
        lines.append(f"    note: {rep.note}")
    return lines


def run_probe(args: argparse.Namespace, services: Services) -> int:
    cluster = _store(services).get(args.name)
    tier = _tier(services, args.tier) if args.tier else None
    if args.engine == "sparkinfer" and tier is None:
        tier = _tier(services, SPARKINFER_TIER)
    spec = ShardSetSpec.from_tier(tier) if tier is not None else None
    if args.hashes_from is not None:
        if spec is None:
            raise ClusterError("--hashes-from needs --tier (which files to compare).")
        spec = spec.with_download_record(args.hashes_from)
    if args.sha256 and (spec is None or not spec.sha256):
        print(
            "note: no published sha256 to compare with (use --hashes-from DIR); "
            "checking headers and sizes only.",
            file=sys.stderr,
        )
    bridge: tuple[str, ...] = ()
    if args.engine == "sparkinfer":  # rank 0 also needs the bridge's tokenizer and template
        from k3desk.core.app.clusters import SparkInferConfig

        bridge = SparkInferConfig(cluster).bridge_paths
    reports = probe_nodes(
        services,
        cluster,
        spec=spec,
        check_sha256=args.sha256,
        progress=_progress if not args.json else lambda p: None,
        rank0_paths=bridge,
    )
    plan = (
        plan_cluster(services, args.engine, reports, tier.size_bytes, args.ctx)
        if args.engine and tier is not None
        else None
    )
    if args.json:
        out: dict[str, Any] = {"cluster": cluster.name, "nodes": [r.to_dict() for r in reports]}
        if plan is not None:
            out["plan"] = {
                "engine": plan.engine,
                "verdict": plan.verdict,
                "reason": plan.reason,
                "nodes": [
                    {"node": b.node, "role": b.role, "capacity": b.capacity, "need": b.need,
                     "memory": b.memory_kind, "disk": b.disk}
                    for b in plan.nodes
                ],
            }  # fmt: skip
        print(json.dumps(out, indent=2))
    else:
        for r in reports:
            print("\n".join(_describe(r)))
        if plan is not None:
            print()
            print(plan.render())
    return 0 if all(r.ok for r in reports) else 1


# ------------------------------------------------------------------ serve


def _kv(items: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ClusterError(f"{what} {item!r} is not KEY=VALUE.")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _on_event(ev: GroupEvent) -> None:
    if ev.progress is not None:
        detail = f": {ev.progress.detail}" if ev.progress.detail else ""
        print(f"  {ev.progress.stage}{detail}", file=sys.stderr)
    elif ev.message and ev.state is not GroupState.STARTING:
        print(f"[{ev.state.value}] {ev.message}", file=sys.stderr)


def _sparkinfer(
    args: argparse.Namespace, services: Services, cluster: Cluster
) -> GroupSupervisor | None:
    from k3desk.core.app.clusters import (
        bridge_key_name,
        check_sparkinfer,
        check_tier,
        describe_launch,
        reply_caps,
    )
    from k3desk.core.app.sparkinfer_launch import SparkInferRequest, configure_sparkinfer

    tier = _tier(services, args.tier or SPARKINFER_TIER)
    why = check_tier(tier)
    if why:
        raise ClusterError(why, f"SparkInfer serves only {SPARKINFER_TIER}; use --engine rpc.")
    ctx = args.ctx or LAUNCHER_MAX_CTX
    config = configure_sparkinfer(
        cluster,
        SparkInferRequest(
            profile=args.profile,
            tier=tier,
            model_file=args.model or "",
            max_ctx=ctx,
            spec_draft=args.spec_draft,
            env=_kv(args.env, "--env"),
            coord_port=args.coord_port,
            serve_port=args.serve_port,
            bridge_port=args.bridge_port,
            bridge_argv=tuple(args.bridge_cmd.split()) if args.bridge_cmd else (),
            recipe_dir=args.recipe_dir or "",
            tokenizer_dir=args.tokenizer_dir or "",
            chat_template=args.chat_template or "",
            load_timeout=args.timeout,
        ),
    )
    kept = (
        f"the system keyring (service 'k3desk', entry {bridge_key_name(cluster.name)!r})"
        if services.secrets.keyring_usable()
        else "this session only (no usable system keyring; a new key next time)"
    )
    notes = _launch_notes(config.recipe_profile, config.spec_draft, *reply_caps(ctx))
    if args.dry_run:
        # what can be told without the nodes: the same warnings and refusals a start gives
        # (the hardware is not probed in a dry run)
        unprobed = check_sparkinfer(config, tier=tier)
        _print_dry_run(describe_launch(config), notes, kept, unprobed.warnings, unprobed.refusals)
        return None
    for note in notes:
        print(note, file=sys.stderr)
    print(f"The bridge's API key is kept in {kept}.", file=sys.stderr)
    reports = (
        [] if args.no_probe else _probe_for_launch(services, cluster, tier, config.bridge_paths)
    )
    check = check_sparkinfer(
        config,
        tier=tier,
        profiles={r.node.label: r.hardware for r in reports},
        reports=reports,
    )
    for w in check.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not args.force:
        check.raise_if_refused()
    else:
        for refusal in check.refusals:
            print(f"warning (forced): {refusal}", file=sys.stderr)
    return start_group(
        services, config, policy=GroupPolicy(max_failures=args.max_restarts), on_event=_on_event
    )


def _launch_notes(
    profile: RecipeProfile, spec_draft: int | None, cap: int, default: int
) -> list[str]:
    """What a SparkInfer start says first: the recipe profile, the reply cap and the draft
    width."""
    notes = [
        f"profile {profile.name}: {profile.title}, {profile.note} ({profile.source})",
        f"replies up to {cap} tokens (K3_MAX_TOKENS; {default} when a request names no limit)",
    ]
    width = spec_draft_note(profile.name, spec_draft)
    if width:
        notes.append(width)
    return notes


def _print_dry_run(
    launch: Sequence[tuple[str, str]],
    notes: Sequence[str],
    kept: str,
    warnings: Sequence[str],
    refusals: Sequence[str],
) -> None:
    """What ``cluster serve --dry-run`` says for SparkInfer: the commands, the notes, and
    the warnings and refusals that need no probe."""
    for node, command in launch:
        print(f"{node}: {command}")
    for note in notes:
        print(f"# {note}")
    print(f"# K3_API_KEY is masked: the key is kept in {kept}, shown when the bridge is ready")
    print(
        "# before the start every rank's binary and libsparkinfer_*.so are compared by "
        "SHA-256 (as the recipe's k3_cluster.sh sync does)"
    )
    for w in warnings:
        if "hardware not probed" not in w:
            print(f"# warning: {w}")
    for refusal in refusals:
        print(f"# refused: {refusal}")
    print("# not probed (dry run): the nodes' GPUs and model copies are checked at the start")


def _probe_for_launch(
    services: Services, cluster: Cluster, tier: Tier, rank0_paths: Sequence[str]
) -> list[NodeReport]:
    """Every node probed before a start; one that cannot be probed stops it."""
    print("Probing the nodes...", file=sys.stderr)
    reports = probe_nodes(services, cluster, tier=tier, rank0_paths=rank0_paths)
    for r in reports:
        if not r.ok:
            raise ClusterError(f"Node {r.node.label} cannot be probed: {r.error}")
    return reports


def _rpc(args: argparse.Namespace, services: Services, cluster: Cluster) -> GroupSupervisor | None:
    from k3desk.core.app.clusters import RPC_WARNING, ClusterLaunch, RpcConfig, worker_argv
    from k3desk.core.app.engines import find_llama_server
    from k3desk.core.app.values import EngineError

    if not args.model:
        raise ClusterError(
            "RPC needs the model's first shard on this machine: pass --model PATH.",
            "Only this machine needs the files; the workers receive the layers over the network.",
        )
    server = find_llama_server(services.paths, configured=args.server)
    if server is None:
        raise EngineError(
            "No llama-server found.", "Build one with `k3desk engine install`, or pass --server."
        )
    launch = ClusterLaunch(
        engine="rpc",
        ctx=args.ctx or RPC_CTX,
        model=args.model,
        rpc_port=args.rpc_port,
        bind=tuple(_kv(args.bind, "--bind").items()),
        allow_public=args.allow_public,
    )
    config = launch_config(services, cluster, launch, engine_binary=server)
    assert isinstance(config, RpcConfig)
    print(f"warning: {RPC_WARNING}", file=sys.stderr)
    if args.dry_run:
        from k3desk.core.app.clusters import remote_command
        from k3desk.core.app.hardware import launch_env

        for n in cluster.nodes:
            print(f"{n.label}: {remote_command(worker_argv(config, n), launch_env())}")
        print(f"this machine: {remote_command([str(server), *config.server_argv()], launch_env())}")
        return None
    return start_group(
        services, config, policy=GroupPolicy(max_failures=args.max_restarts), on_event=_on_event
    )


def run_serve(args: argparse.Namespace, services: Services) -> int:
    cluster = _store(services).get(args.name)
    make = _sparkinfer if args.engine == "sparkinfer" else _rpc
    group = make(args, services, cluster)
    if group is None:  # --dry-run
        return 0
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        group.start()
        deadline = time.monotonic() + args.timeout
        while group.endpoint is None:
            if stop.is_set():
                print("Stopping...", file=sys.stderr)
                return 130
            if group.wait_stopped(0.1):
                raise group.error or ClusterError("The cluster stopped before it was ready.")
            if time.monotonic() > deadline:
                raise ClusterError(f"Not ready within {args.timeout:.0f} s; stopping.")
        ep = group.endpoint
        print(f"Ready: {ep.root}" + (f"  (model {ep.model})" if ep.model else ""))
        if ep.api_key:
            print(f"API key: {ep.api_key}")
        if args.check:
            return _smoke(group)
        print("Every process is watched; Ctrl-C stops them all.", file=sys.stderr)
        while not stop.is_set():
            if group.wait_stopped(0.2):
                raise group.error or ClusterError("The cluster stopped.")
        print("Stopping...", file=sys.stderr)
        return 0
    finally:
        group.stop()
        for s, h in old.items():
            signal.signal(s, h)


def _smoke(group: GroupSupervisor) -> int:
    from k3desk.core.app.chat import ChatClient, ChatMessage, ChatSettings
    from k3desk.core.app.clusters import SparkInferCluster

    ep = group.endpoint
    assert ep is not None
    seen = len(group.stats) if isinstance(group, SparkInferCluster) else 0
    with ChatClient(ep) as client:
        settings = ChatSettings(thinking=False, max_tokens=16)
        result = client.chat([ChatMessage("user", "Say hello in five words.")], settings)
    speed = ""
    stats = group.wait_stats(seen + 1, 5.0) if isinstance(group, SparkInferCluster) else None
    if stats is not None:
        speed = f", {stats.decode_tokens_per_s:.1f} tok/s decode (rank 0's log)"
    elif result.timings is not None and result.timings.predicted_per_second:
        speed = f", {result.timings.predicted_per_second:.1f} tok/s decode"
    print(f"Chat check: {len(result.text)} characters back{speed}.")
    print(f"  {result.text.strip()[:200]}")
    return 0


# ------------------------------------------------------------------ explain / endpoints


def run_explain(args: argparse.Namespace, services: Services) -> int:
    from k3desk.core.app.clusters import CARD_COMMAND, explain_card_command

    print(explain_card_command(args.command or CARD_COMMAND))
    return 0


def run_endpoint_add(args: argparse.Namespace, services: Services) -> int:
    key = args.key
    if key is None and not args.key_env and os.environ.get("K3DESK_ENDPOINT_KEY"):
        key = os.environ["K3DESK_ENDPOINT_KEY"]
    request = EndpointRequest(
        args.name,
        args.url,
        api_key=key,
        key_env=args.key_env,
        model=args.model,
        check=not args.no_check,
        replace_existing=args.replace,
        server=args.server,
        max_tokens_limit=args.max_tokens_limit,
        context_limit=args.context_limit,
    )
    ep, where = add_endpoint(endpoint_store(services), request)
    what = []
    if ep.model:
        what.append(f"model {ep.model}")
    if ep.n_ctx:
        what.append(f"context {ep.n_ctx}")
    if ep.vision is not None:
        what.append("images" if ep.vision else "text only")
    print(f"Attached {ep.name!r} at {ep.url}" + (f" ({', '.join(what)})" if what else "") + ".")
    if ep.server:
        print(f"  Server: {ep.server_text()}.")
    print(f"  {where}.")
    return 0


def run_endpoint_set(args: argparse.Namespace, services: Services) -> int:
    server = None if args.server == "auto" else args.server
    ep, _ = set_endpoint_server(endpoint_store(services), args.name, server)
    if server is None:
        print(f"{ep.name}: k3desk finds out what kind of server it is on next use.")
    else:
        print(f"{ep.name}: treated as {DIALECTS[server].label} from now on.")
    return 0


def run_endpoint_list(args: argparse.Namespace, services: Services) -> int:
    eps = endpoint_store(services).load()
    if args.json:
        print(json.dumps([e.__dict__ for e in eps], indent=2))
        return 0
    if not eps:
        print("No endpoints attached: `k3desk cluster endpoint add NAME URL`.")
    for e in eps:
        key = "keyring" if e.key_in_keyring else (f"${e.key_env}" if e.key_env else "no key")
        kind = f"  {e.server_text()}" if e.server else ""
        print(f"{e.name:<16} {e.url}  {e.model or ''}  [{key}]{kind}")
    return 0


def run_endpoint_remove(args: argparse.Namespace, services: Services) -> int:
    ep = remove_endpoint(endpoint_store(services), args.name)
    print(f"Detached {ep.name!r} ({ep.url}).")
    return 0


def run_endpoint_check(args: argparse.Namespace, services: Services) -> int:
    st = check_endpoint(endpoint_store(services), args.name)
    if not st.up:
        print(f"{st.endpoint.name}: DOWN — {st.error}")
        return 1
    caps = st.capabilities
    assert caps is not None
    parts = [
        f"model {caps.model}" if caps.model else "",
        f"context {caps.n_ctx}" if caps.n_ctx else "",
    ]
    info = ", ".join(p for p in parts if p)
    print(f"{st.endpoint.name}: up at {st.endpoint.url} ({info}; {st.latency_s * 1000:.0f} ms)")
    server = caps.server
    limits = server.limits_text()
    print(f"  Server: {server.describe()}" + (f"; {limits}" if limits else "") + ".")
    if server.problem:
        print(f"  It cannot chat: {server.problem}.")
        return 1
    return 0
