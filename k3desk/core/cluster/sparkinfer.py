"""SparkInfer TP3/TP4 over SSH, with the command line verified in its source.

SparkInfer (gittensor-ai-lab/sparkinfer-k3 v0.2.2 plus the vcruz305 recipe's
patch chain) runs one ``kimi_k3_dist_generate`` process per node::

    kimi_k3_dist_generate --rank R --world 3|4 (--listen IP:PORT | --coord IP:PORT)
                          --model <shard 1 .gguf> --max-ctx N [--serve IP:PORT]
                          [--spec-draft K --spec-ngram-min 1 --spec-ngram-max N ...]

with the environment and drafter flags of one of the recipe's own profiles
(:mod:`k3desk.core.cluster.recipe`, read from its ``scripts/k3_cluster.sh`` and receipts).

Rank 0 listens (``--listen``) and the workers connect to it (``--coord``); with
``--serve`` rank 0 opens a line-protocol socket (one TCP connection per request:
``prompt_ids=…;n_predict=N;stop_ids=…;stream=0|1``, answered by ``tok=ID`` lines and
one final ``ok=1;generated_ids=…;stop_reason=…`` or ``ok=0;error=…`` line).  The
recipe's FastAPI bridge (``api-server/run-api.sh`` -> ``server.py``), started beside
rank 0, tokenizes with the model's own tokenizer and chat template and turns that
socket into OpenAI-compatible HTTP (port 8000, model ``kimi-k3-neuron``), guarded by
``K3_API_KEY`` (the recipe: "Set K3_API_KEY even on a trusted network") and allowed
replies as long as the context (``K3_MAX_TOKENS``; its default of 512 refuses longer
requests and cuts replies, reasoning included).  The model
card's command (``sparkinfer --tp 3 --ctx-len --jdba-band``, port 9000, a directory
as ``--model``) does not exist: :func:`explain_card_command` tells a person who
copied it what to use instead.

:class:`SparkInferCluster` first checks that every rank runs the same build (the binary
and its ``libsparkinfer_*.so``, by SHA-256: :mod:`k3desk.core.cluster.sparkinfer_dist`) and
that the bridge can render a prompt, then starts rank 0, the workers over SSH, and the
bridge; follows rank 0's log phases and the bridge's ``/readyz`` (older bridges have
none: then ``/healthz`` plus a connect to the serve port on rank 0); watches every
rank (a dead worker is noticed at once through its ssh connection, not at the
next request as rank 0 would); and restarts all ranks together.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from k3desk.core.chat.client import ChatEndpoint
from k3desk.core.chat.dialects import Limits
from k3desk.core.cluster.bridge_env import require_bridge_env
from k3desk.core.cluster.group import (
    EventCallback,
    GroupPolicy,
    GroupSupervisor,
    LaunchFailure,
    stop_remote_processes,
)
from k3desk.core.cluster.nodes import ClusterError, Node
from k3desk.core.cluster.sparkinfer_card import CARD_COMMAND, explain_card_command
from k3desk.core.cluster.sparkinfer_checks import check_sparkinfer, check_tier
from k3desk.core.cluster.sparkinfer_config import (
    BINARY,
    BRIDGE_PORT,
    CHAT_TEMPLATE_NAME,
    COORD_PORT,
    DEFAULT_BRIDGE,
    GEOMETRY_ERROR,
    RECIPE_DIRNAME,
    SERVE_PORT,
    TARGET_REPO,
    TOKENIZER_DIRNAME,
    TOKENIZER_REPO,
    SparkInferConfig,
    bridge_argv,
    bridge_env,
    bridge_key,
    bridge_key_name,
    bridge_secrets,
    describe_launch,
    rank_argv,
    reply_caps,
)
from k3desk.core.cluster.sparkinfer_dist import check_dist, ssh_runner
from k3desk.core.cluster.ssh import (
    RemoteProcess,
    SshClient,
    classify_ssh_failure,
    remote_command,
)
from k3desk.core.paths import AppPaths
from k3desk.core.progress import CancelToken
from k3desk.core.secrets import SecretStore

# the configuration, the card's command and the checks live in modules of their own
# (sparkinfer_config, sparkinfer_card, sparkinfer_checks); importable from here as before
__all__ = [
    "BRIDGE_PORT",
    "CARD_COMMAND",
    "CHAT_TEMPLATE_NAME",
    "COORD_PORT",
    "DEFAULT_BRIDGE",
    "GEOMETRY_ERROR",
    "PHASE_TEXT",
    "RECIPE_DIRNAME",
    "SERVE_PORT",
    "TOKENIZER_DIRNAME",
    "ServeStats",
    "SparkInferCluster",
    "SparkInferConfig",
    "bridge_key_name",
    "check_sparkinfer",
    "check_tier",
    "describe_launch",
    "explain_card_command",
    "rank_argv",
    "reply_caps",
]


# ------------------------------------------------------------------ supervision


@dataclass(frozen=True)
class ServeStats:
    """One ``[k3-dist][serve]`` line of rank 0."""

    prompt_tokens: int
    generated_tokens: int
    prefill_s: float
    decode_s: float

    @property
    def decode_tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0


_SERVE_RE = re.compile(
    r"\[k3-dist\]\[serve\] prompt_tokens=(\d+) generated_tokens=(\d+) "
    r"prefill_s=([\d.]+) decode_s=([\d.]+)"
)
_SHARD_RE = re.compile(r"\[gguf\] shard (\d+)/(\d+) mapped")
_PHASES = (
    ("listening", re.compile(r"\[rank0\] listening .*waiting for (\d+) workers")),
    ("nccl", re.compile(r"NCCL ready")),
    ("loaded0", re.compile(r"\[k3-dist\] rank 0 loaded ok")),
    ("complete", re.compile(r"rank0 bootstrap\+load complete")),
    ("serving", re.compile(r"\[rank0\] serve mode listening on")),
)
PHASE_TEXT = (
    "starting rank 0",
    "rank 0 waiting for workers",
    "workers connected (NCCL ready), loading weights",
    "rank 0 loaded",
    "every rank loaded",
    "serve socket open",
    "bridge ready",
)
StatsCallback = Callable[[ServeStats], None]


class SparkInferCluster(GroupSupervisor):
    kind = "SparkInfer cluster"

    def __init__(
        self,
        config: SparkInferConfig,
        paths: AppPaths,
        known_hosts: Path,
        *,
        policy: GroupPolicy | None = None,
        on_event: EventCallback | None = None,
        on_stats: StatsCallback | None = None,
        connect_timeout: int = 10,
        secrets: SecretStore | None = None,
    ) -> None:
        """With ``secrets``, a config without an ``api_key`` gets the cluster's bridge key
        from there (made and kept on first use) when it starts, off the caller's thread:
        a keyring may block on an unlock prompt."""
        super().__init__(policy=policy, on_event=on_event)
        self.config = config
        self._secrets = secrets
        self.new_key = False  # the key was made for this start (show it once)
        self.paths = paths
        self.known_hosts = known_hosts
        self._connect_timeout = connect_timeout
        self._on_stats = on_stats
        self._procs: list[RemoteProcess] = []
        self._bridge: RemoteProcess | None = None
        self._flags: set[str] = set()
        self._flag_cond = threading.Condition()
        self._shards = (0, 0)
        self.stats: list[ServeStats] = []
        self._lib_dirs: dict[int, str] = {}  # rank -> its binary's folder (bare names)

    @property
    def ranks(self) -> list[RemoteProcess]:
        with self._lock:
            return list(self._procs)

    def wait_stats(self, count: int, timeout: float) -> ServeStats | None:
        """The latest serve line once at least ``count`` were seen (rank 0 logs it last)."""
        deadline = time.monotonic() + timeout
        while len(self.stats) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.stats[-1] if len(self.stats) >= count else None

    @property
    def bridge(self) -> RemoteProcess | None:
        with self._lock:
            return self._bridge

    # ------------------------------------------------------------ launch
    def _log_path(self, attempt: int, what: str) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        d = self.paths.logs_dir / "cluster" / self.config.cluster.name
        return d / f"sparkinfer-{stamp}-a{attempt}-{what}.log"

    def _client(self, node: Node) -> SshClient:
        return SshClient(node, self.known_hosts, connect_timeout=self._connect_timeout)

    def _start(self, rank: int, attempt: int) -> RemoteProcess:
        cfg = self.config
        node = cfg.cluster.nodes[rank]
        proc = RemoteProcess(
            self._client(node),
            rank_argv(cfg, rank),
            name=f"rank {rank}",
            env=cfg.rank_env_of(rank),
            library_path=cfg.library_path(node) or self._lib_dirs.get(rank, ""),
            cwd=node.workdir,
            log_path=self._log_path(attempt, f"rank{rank}"),
            on_line=self._rank0_line if rank == 0 else None,
            on_exit=self._member_exit,
            tie_to_thread=True,
        )
        with self._lock:
            self._procs.append(proc)
        return proc.start()

    def _launch(self, attempt: int, cancel: CancelToken) -> ChatEndpoint:
        if self._secrets is not None and not self.config.api_key:
            key, self.new_key = bridge_key(self._secrets, self.config.cluster.name)
            self.config = replace(self.config, api_key=key)
        cfg = self.config
        total = len(PHASE_TEXT)
        with self._flag_cond:
            self._flags = set()
        self._shards = (0, 0)
        self._phase(PHASE_TEXT[0], 0, total, cfg.rank0.label)
        if attempt == 1:  # before minutes of loading: one build everywhere, a working bridge
            self._phase(PHASE_TEXT[0], 0, total, "comparing every rank's SparkInfer build")
            binaries = [n.sparkinfer_bin or BINARY for n in cfg.cluster.nodes]
            dists = check_dist(
                cfg.cluster.nodes,
                binaries,
                ssh_runner(self._client, self._connect_timeout + 30, cancel),
            )
            self._lib_dirs = {r: d.folder for r, d in enumerate(dists)}
            require_bridge_env(
                self._client(cfg.rank0),
                bridge_argv=bridge_argv(cfg),
                recipe_dir=cfg.recipe_path,
                env=bridge_env(cfg),
                where=f"rank 0 ({cfg.rank0.label})",
                cancel=cancel,
            )
        rank0 = self._start(0, attempt)
        self._started(rank0, cancel)
        self._await("listening", 60.0, cancel)
        self._phase(PHASE_TEXT[1], 1, total, f"{cfg.world - 1} workers to connect")
        workers = [self._start(r, attempt) for r in range(1, cfg.world)]
        for w in workers:
            self._started(w, cancel)
        self._await("nccl", cfg.connect_timeout, cancel)
        self._phase(PHASE_TEXT[2], 2, total)
        self._await("loaded0", cfg.load_timeout, cancel)
        self._phase(PHASE_TEXT[3], 3, total)
        self._await("complete", cfg.load_timeout, cancel)
        self._phase(PHASE_TEXT[4], 4, total)
        self._await("serving", cfg.ready_timeout, cancel)
        self._phase(PHASE_TEXT[5], 5, total, f"127.0.0.1:{cfg.serve_port} on {cfg.rank0.label}")
        bridge = RemoteProcess(
            self._client(cfg.rank0),
            bridge_argv(cfg),
            name="bridge",
            env=bridge_env(cfg),
            secret_env=bridge_secrets(cfg),
            cwd=cfg.rank0.workdir,
            log_path=self._log_path(attempt, "bridge"),
            on_exit=self._member_exit,
            tie_to_thread=True,
        )
        with self._lock:
            self._bridge = bridge
        bridge.start()
        self._started(bridge, cancel)
        how = self._await_bridge(cfg.url, cfg.ready_timeout, cancel)
        self._phase(PHASE_TEXT[6], 7, total, f"{cfg.url} ({how})")
        # the bridge does not say its context; k3desk set it (K3_MAX_CONTEXT_TOKENS)
        told = Limits(context=cfg.max_ctx or None, source="K3_MAX_CONTEXT_TOKENS as launched")
        return ChatEndpoint(
            cfg.url, cfg.api_key or None, cfg.model_name, "sparkinfer-bridge", told
        )

    def _started(self, proc: RemoteProcess, cancel: CancelToken) -> None:
        deadline = time.monotonic() + self._connect_timeout + 20
        while proc.remote_pid is None:
            if proc.ended:
                raise self._failure()
            self._check_running(cancel)
            if time.monotonic() > deadline:
                raise LaunchFailure(f"{proc.name} on {proc.node.label} did not start in time")
            time.sleep(0.02)

    def _await(self, flag: str, timeout: float, cancel: CancelToken) -> None:
        deadline = time.monotonic() + timeout
        with self._flag_cond:
            while flag not in self._flags:
                if self._fault.is_set() or self._stop.is_set() or cancel.cancelled:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._flag_cond.wait(min(left, 0.1))
            if flag in self._flags:
                return
        if self._fault.is_set():
            raise self._failure()
        self._check_running(cancel)
        text = dict(zip((p for p, _ in _PHASES), PHASE_TEXT[1:], strict=False)).get(flag, flag)
        raise LaunchFailure(
            f"rank 0 did not reach '{text}' within {timeout:.0f} s",
            f"See the rank logs under {self.paths.logs_dir / 'cluster' / self.config.cluster.name}",
        )

    def _serve_port_open(self) -> bool:
        """Whether rank 0's serve socket accepts a connection (it binds 127.0.0.1 there)."""
        node = self.config.rank0
        probe = (
            "import socket; socket.create_connection(('127.0.0.1', "
            f"{int(self.config.serve_port)}), 3).close()"
        )
        try:
            result = self._client(node).run(
                remote_command([node.python, "-c", probe]), timeout=self._connect_timeout + 10
            )
        except ClusterError:
            return False
        return result.returncode == 0

    def _await_bridge(self, url: str, timeout: float, cancel: CancelToken) -> str:
        """Wait until the bridge can answer; how that was told, for the progress line.

        ``/readyz`` says so where the bridge has it.  Older bridges answer it with 404:
        then ready means ``/healthz`` answers and rank 0's serve port accepts.
        """
        deadline = time.monotonic() + timeout
        last = "no answer"
        legacy = False
        with httpx.Client(timeout=3.0) as http:
            while True:
                if self._fault.is_set():
                    raise self._failure()
                self._check_running(cancel)
                try:
                    if not legacy:
                        r = http.get(f"{url}/readyz")
                        if r.status_code == 200:
                            return "/readyz"
                        legacy = r.status_code == 404
                        last = f"/readyz: HTTP {r.status_code}"
                    if legacy:
                        h = http.get(f"{url}/healthz")
                        last = f"no /readyz; /healthz: HTTP {h.status_code}"
                        if h.status_code == 200:
                            if self._serve_port_open():
                                return "no /readyz: /healthz and the serve port answer"
                            last = (
                                f"no /readyz; /healthz answers but 127.0.0.1:"
                                f"{self.config.serve_port} on {self.config.rank0.label} "
                                "does not accept"
                            )
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                if time.monotonic() > deadline:
                    raise LaunchFailure(
                        f"the bridge at {url} did not report ready within {timeout:.0f} s ({last})"
                    )
                self._sleep(0.5 if legacy else 0.1, cancel)

    def _failure(self) -> LaunchFailure:
        """Why the launch failed, from the members that ended (fatal when a restart can't help)."""
        ended = [p for p in self.ranks + ([self.bridge] if self.bridge else []) if p.ended]
        for p in ended:
            text = "\n".join(p.tail(40))
            where = f"{p.name} on {p.node.label}"
            if GEOMETRY_ERROR in text:
                return LaunchFailure(
                    f"SparkInfer refused the model on {p.node.label}: {GEOMETRY_ERROR}",
                    f"Only the pruned 9-shard {TARGET_REPO} tier loads in SparkInfer; "
                    "run other tiers with llama.cpp (--engine rpc, or one machine).",
                    fatal=True,
                )
            m = re.search(r"unknown arg: ?(\S+)", text)
            if m:
                return LaunchFailure(
                    f"{where}: this SparkInfer build does not accept '{m.group(1)}' (unknown arg)",
                    "k3desk uses the command line of sparkinfer-k3 v0.2.2 with the recipe's "
                    "patches; rebuild it from that source.",
                    fatal=True,
                )
            if p.exit_status == 127 or p.missing_folder:
                return LaunchFailure(
                    f"{where}: {p.describe_exit()}",
                    f"Install {BINARY} on {p.node.label} or set sparkinfer=PATH for that node."
                    if p.exit_status == 127
                    else "Fix workdir= for that node.",
                    fatal=True,
                )
            if p.exit_status == 2 and p is self.bridge:
                last = p.tail(1)[0] if p.tail(1) else ""
                return LaunchFailure(
                    f"the recipe's HTTP bridge on {p.node.label} refused to start: {last}",
                    f"It needs the model's tokenizer folder and {CHAT_TEMPLATE_NAME} on "
                    f"{p.node.label} (k3desk passed {self.config.tokenizer_path or '(none)'} "
                    f"and {self.config.chat_template_path or '(none)'}; the recipe fetches "
                    f"the tokenizer from {TOKENIZER_REPO}), and the recipe's api-server in "
                    f"{self.config.recipe_path}.",
                    fatal=True,
                )
            if p.exit_status == 2:
                last = p.tail(1)[0] if p.tail(1) else ""
                return LaunchFailure(f"{where} rejected its arguments: {last}", fatal=True)
            if p.ssh_returncode == 255 and p.remote_pid is None:
                err = classify_ssh_failure(p.node, "\n".join(p.tail(5)), p.client.known_hosts)
                return LaunchFailure(err.message, err.hint)
        if ended:
            p = ended[0]
            last = p.tail(1)[0] if p.tail(1) else ""
            return LaunchFailure(f"{p.name} on {p.node.label} {p.describe_exit()}: {last}")
        with self._lock:
            reason = self._fault_reason
        return LaunchFailure(reason or "a member ended during the launch")

    # ------------------------------------------------------------ watching
    def _rank0_line(self, proc: RemoteProcess, line: str) -> None:
        for flag, rx in _PHASES:
            if rx.search(line):
                with self._flag_cond:
                    self._flags.add(flag)
                    self._flag_cond.notify_all()
        m = _SHARD_RE.search(line)
        if m:
            i, n = int(m.group(1)), int(m.group(2))
            self._shards = (i, n)
            self._phase(PHASE_TEXT[2], 2, len(PHASE_TEXT), f"rank 0: shard {i}/{n} mapped")
            return
        m = _SERVE_RE.search(line)
        if m:
            stats = ServeStats(
                int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4))
            )
            self.stats.append(stats)
            if self._on_stats is not None:
                with contextlib.suppress(Exception):
                    self._on_stats(stats)
            return
        if "prefill failed" in line:
            # rank 0 only finds out at a request; the ssh watch usually knew first
            self.fault(f"rank 0 reported: {line.strip()}")

    def _member_exit(self, proc: RemoteProcess) -> None:
        if proc.stopping:
            return
        last = proc.tail(1)
        tail = f" ({last[0]})" if last else ""
        self.fault(f"{proc.name} on {proc.node.label} {proc.describe_exit()}{tail}")

    def _teardown(self) -> None:
        with self._lock:
            procs = list(self._procs)
            bridge = self._bridge
            self._procs = []
            self._bridge = None
        stop_remote_processes(([bridge] if bridge else []) + procs, self.policy.stop_grace)
