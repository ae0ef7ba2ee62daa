"""Clusters, cluster engines and attached servers for the desktop app, over the core.

One app-wide object (``ctx.cluster``).  The Cluster page edits and
probes clusters and starts engines through it, the Engine page watches the
running group through it, and the engine controller asks it where the chat goes
when no local engine runs: to a ready cluster engine first, else to the attached
server chosen for chat.  Every ssh, HTTP and keyring call runs in the task
manager; group events arrive on the group's monitor thread and reach the main
thread through :mod:`k3desk.ui.bridge` relays.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from k3desk.core.app.cluster_tiers import ClusterTierRow
from k3desk.core.app.clusters import (
    Assessment,
    Cluster,
    ClusterError,
    ClusterLaunch,
    ClusterStore,
    GroupEvent,
    GroupState,
    GroupSupervisor,
    Member,
    NodeReport,
    ServeStats,
    SparkInferConfig,
    assess_cluster,
    cluster_store,
    group_members,
    launch_config,
    probe_nodes,
    start_group,
)
from k3desk.core.app.endpoints import (
    EndpointRequest,
    EndpointStatus,
    EndpointStore,
    RemoteEndpoint,
    add_endpoint,
    check_endpoint,
    endpoint_store,
    remove_endpoint,
    set_endpoint_server,
)
from k3desk.core.app.operations import Change, OpChanges, Operation
from k3desk.core.app.values import CancelToken, K3Error, Progress
from k3desk.ui.bridge import Relay

if TYPE_CHECKING:
    from k3desk.core.app.chat import ChatEndpoint
    from k3desk.core.app.values import Tier
    from k3desk.ui.context import AppContext
    from k3desk.ui.tasks import Task

CLUSTERS = OpChanges.of(Change.CLUSTERS)
ENDPOINTS = OpChanges.of(Change.ENDPOINTS)

log = logging.getLogger(__name__)

RECENT_KEY = "chat_endpoint"  # Settings.recent: the attached server the chat uses
EVENT_LOG = 300


LaunchChoice = ClusterLaunch  # what the person picked on the Cluster page for one launch


@dataclass(frozen=True)
class ProbeRun:
    tier_id: str
    reports: tuple[NodeReport, ...]
    finished_at: float


class ClusterController(QObject):
    """Signals:
    probe_progress(str, object): cluster name, a core Progress while its nodes are probed.
    probe_finished(str): the probe of that cluster ended (see :meth:`probe` / ``probe_errors``).
    group_changed(): a cluster engine was started or stopped, or changed state.
    group_event(object): a core GroupEvent of the running engine (phases, restarts).
    stats(object): a ServeStats line of SparkInfer's rank 0 (one per answer).
    changed(): where the chat goes may have changed.

    A change of the saved clusters (added, edited, removed) or of the attached servers
    (added, checked, removed, chosen for chat) is announced on ``ctx.ops.did_execute``
    (:data:`Change.CLUSTERS`, :data:`Change.ENDPOINTS`).
    """

    probe_progress = Signal(str, object)
    probe_finished = Signal(str)
    group_changed = Signal()
    group_event = Signal(object)
    stats = Signal(object)
    changed = Signal()

    def __init__(self, ctx: AppContext, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.store: ClusterStore = cluster_store(ctx.services)
        self.endpoints: EndpointStore = endpoint_store(ctx.services)
        self._clusters: list[Cluster] | None = None
        self.load_error = ""
        self.probes: dict[str, ProbeRun] = {}
        self.probe_errors: dict[str, str] = {}
        self._probe_tasks: dict[str, Task[Any]] = {}
        self.group: GroupSupervisor | None = None
        self.group_cluster = ""
        self.group_title = ""
        self.launch_choice: LaunchChoice | None = None
        self.events: list[GroupEvent] = []
        self.last_progress: Progress | None = None
        self.last_stats: ServeStats | None = None
        self._relays: list[Relay] = []
        self._stopping = False
        self.active_endpoint = ""
        self._active_ep: ChatEndpoint | None = None
        self.endpoint_error = ""
        ctx.engine.set_external(self)
        wanted = ctx.settings.recent.get(RECENT_KEY)
        if ctx.settings.remote_url:
            wanted = self._adopt_remote_url(ctx.settings.remote_url) or wanted
        if isinstance(wanted, str) and wanted:
            self.use_endpoint(wanted, remember=False)

    # ------------------------------------------------------------ clusters
    def clusters(self) -> list[Cluster]:
        if self._clusters is None:
            try:
                self._clusters = self.store.load()
                self.load_error = ""
            except ClusterError as exc:
                self._clusters = []
                self.load_error = f"{exc.message} {exc.hint}".strip()
        return list(self._clusters)

    def cluster(self, name: str) -> Cluster:
        for c in self.clusters():
            if c.name == name:
                return c
        return self.store.get(name)  # raises with the known names

    def save_cluster(self, cluster: Cluster, old_name: str | None = None) -> Cluster:
        """Add ``cluster``, or put it in place of ``old_name`` (ClusterError names the problems)."""
        if old_name is None:
            self.store.add(cluster)
        elif old_name == cluster.name:
            self.store.add(cluster, replace_existing=True)
        else:
            self.store.add(cluster)
            self.store.remove(old_name)
            if old_name in self.probes:
                self.probes[cluster.name] = self.probes.pop(old_name)
        self._clusters = None
        self.ctx.ops.announce(CLUSTERS)
        return cluster

    def remove_cluster(self, name: str) -> None:
        if self.group_running and self.group_cluster == name:
            raise ClusterError(
                f"An engine runs on cluster {name!r}.", "Stop it on the Engine page first."
            )
        self.store.remove(name)
        self.probes.pop(name, None)
        self.probe_errors.pop(name, None)
        self._clusters = None
        self.ctx.ops.announce(CLUSTERS)

    # --------------------------------------------------------------- probe
    def probing(self, name: str) -> bool:
        task = self._probe_tasks.get(name)
        return task is not None and task.running

    def probe(self, name: str, tier_id: str = "", choice: LaunchChoice | None = None) -> None:
        """Probe every node of ``name`` (hardware, engines, the tier's copy) in the background.

        Rank 0 is also asked for the SparkInfer bridge's tokenizer folder and chat template:
        ``choice``'s paths and the defaults beside the shards.
        """
        if self.probing(name):
            return
        cluster = self.cluster(name)
        tier = self._tier(tier_id) if tier_id else None
        bridge = SparkInferConfig(cluster).bridge_paths
        if choice is not None:
            bridge = self.sparkinfer_config(cluster, choice).bridge_paths + bridge
        relay = Relay(self)
        relay.fired.connect(lambda p: self.probe_progress.emit(name, p))

        def work(token: CancelToken) -> list[NodeReport]:
            return probe_nodes(
                self.ctx.services,
                cluster,
                tier=tier,
                progress=relay,
                cancel=token,
                rank0_paths=bridge,
            )

        def done(reports: list[NodeReport]) -> None:
            self.probes[name] = ProbeRun(tier_id, tuple(reports), time.time())
            self.probe_errors.pop(name, None)

        def error(exc: BaseException) -> None:
            self.probe_errors[name] = (
                f"{exc.message} {exc.hint}".strip() if isinstance(exc, K3Error) else str(exc)
            )

        def end() -> None:
            self._probe_tasks.pop(name, None)
            relay.deleteLater()
            self.probe_finished.emit(name)

        self.probe_errors.pop(name, None)
        self._probe_tasks[name] = self.ctx.ops.run(
            Operation(f"probe-{name}", work), on_success=done, on_failure=error, on_finally=end
        )

    def reports(self, name: str, tier_id: str | None = None) -> list[NodeReport]:
        """The last probe's reports; their copy checks only when probed for ``tier_id``."""
        run = self.probes.get(name)
        if run is None:
            return []
        if tier_id is not None and run.tier_id != tier_id:
            return [replace(r, copy=None) for r in run.reports]
        return list(run.reports)

    # ----------------------------------------------------------- assessment
    def _tier(self, tier_id: str) -> Tier | None:
        try:
            return self.ctx.services.catalog.get(tier_id)
        except K3Error:
            return None

    def sparkinfer_config(self, cluster: Cluster, choice: LaunchChoice) -> SparkInferConfig:
        """The use-case's configuration; an unknown profile raises ClusterError."""
        config = launch_config(self.ctx.services, cluster, replace(choice, engine="sparkinfer"))
        assert isinstance(config, SparkInferConfig)
        return config

    def assess(
        self, name: str, choice: LaunchChoice, *, model_bytes: int | None = None
    ) -> Assessment:
        """Refusals, warnings and the plan for ``choice`` on cluster ``name`` (no network).

        ``model_bytes`` (RPC): judge a model of that size that is not on this machine yet
        (a tier about to be downloaded) instead of ``choice.model``'s files.
        """
        # llama-server runs here: the plan counts this machine, never a hardware file the
        # pages may be judging (detected here if the pages have not needed it yet: once)
        local = None
        if choice.engine != "sparkinfer":
            local = self.ctx.hardware.machine or self.ctx.hardware.this_machine()
        return assess_cluster(
            self.ctx.services,
            self.cluster(name),
            choice,
            reports=self.reports(name, choice.tier_id),
            local=local,
            engine_binary=self.ctx.settings.engine_binary or None,
            model_bytes=model_bytes,
        )

    def judge_tiers(
        self, name: str, choice: LaunchChoice, tiers: Sequence[Tier]
    ) -> list[ClusterTierRow]:
        """Every tier in ``tiers`` judged for ``choice``'s engine on cluster ``name``: the
        engine's refusals (SparkInfer loads one tier only) and the cross-node memory plan."""
        out = []
        for tier in tiers:
            pick = replace(choice, tier_id=tier.id)
            size = tier.size_bytes if choice.engine == "rpc" else None
            out.append(ClusterTierRow(tier, self.assess(name, pick, model_bytes=size)))
        return out

    # --------------------------------------------------------------- engine
    @property
    def group_running(self) -> bool:
        g = self.group
        return g is not None and g.state not in (GroupState.STOPPED, GroupState.FAILED)

    def members(self) -> list[Member]:
        return group_members(self.group) if self.group is not None else []

    def start(self, name: str, choice: LaunchChoice) -> GroupSupervisor:
        """Start ``choice`` on cluster ``name``; refused (ClusterError) while refusals remain."""
        if self.group_running or self._stopping:
            raise ClusterError(
                f"{self.group_title} already runs on cluster {self.group_cluster!r}.",
                "Stop it on the Engine page first.",
            )
        verdict = self.assess(name, choice)
        if not verdict.ok:
            raise ClusterError(
                f"{verdict.title} cannot start on {name!r}: " + " ".join(verdict.refusals)
            )
        config = launch_config(
            self.ctx.services,
            self.cluster(name),
            choice,
            engine_binary=self.ctx.settings.engine_binary or None,
        )
        relay = Relay(self)
        stats = Relay(self)
        # SparkInfer's bridge key is read from the secret store off this thread
        group = start_group(self.ctx.services, config, on_event=relay, on_stats=stats)
        relay.fired.connect(lambda ev: self._on_event(group, ev))
        stats.fired.connect(lambda s: self._on_stats(group, s))
        # an older group's relays stay alive: a monitor that outlived its stop may still call
        # them, and _on_event ignores what does not come from the current group
        self._relays += [relay, stats]
        self.group = group
        self.group_cluster = name
        self.group_title = verdict.title
        self.launch_choice = choice
        self.events = []
        self.last_progress = None
        self.last_stats = None
        group.start()
        self.group_changed.emit()
        self.changed.emit()
        return group

    def stop(self, then: Callable[[], None] | None = None) -> None:
        """Stop every process of the running engine (in the background)."""
        group = self.group
        if group is None or self._stopping:
            return
        self._stopping = True
        self.group_changed.emit()

        def end() -> None:
            self._stopping = False
            self.group_changed.emit()
            self.changed.emit()
            if then is not None:
                then()

        self.ctx.ops.run(Operation("cluster-stop", lambda _t: group.stop()), on_finally=end)

    def restart(self) -> None:
        """Stop every process, then start the same engine on the same cluster again."""
        name, choice = self.group_cluster, self.launch_choice
        if not name or choice is None:
            return

        def again() -> None:
            try:
                self.start(name, choice)
            except K3Error as exc:
                self.ctx.reporter.report(exc)

        if self.group is not None and self.group.state is not GroupState.STOPPED:
            self.stop(then=again)
        else:
            again()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def _on_event(self, group: GroupSupervisor, ev: GroupEvent) -> None:
        if group is not self.group:
            return
        self.events.append(ev)
        del self.events[:-EVENT_LOG]
        if ev.progress is not None:
            self.last_progress = ev.progress
        self.group_event.emit(ev)
        self.group_changed.emit()
        if ev.progress is None:
            self.changed.emit()

    def _on_stats(self, group: GroupSupervisor, s: ServeStats) -> None:
        if group is self.group:
            self.last_stats = s
            self.stats.emit(s)

    # ------------------------------------------------------------- servers
    def endpoint_list(self) -> list[RemoteEndpoint]:
        return self.endpoints.load()

    def attach(
        self,
        name: str,
        url: str,
        *,
        api_key: str | None = None,
        key_env: str = "",
        server: str | None = None,
        on_done: Callable[[RemoteEndpoint, str], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Attach ``url`` (checked now; the key goes to the keyring) and use it for chat.

        ``server``: what kind of server it is (None: k3desk finds out)."""

        def work(_t: CancelToken) -> tuple[RemoteEndpoint, str]:
            request = EndpointRequest(
                name, url, api_key=api_key, key_env=key_env, check=True, replace_existing=True,
                server=server,
            )  # fmt: skip
            return add_endpoint(self.endpoints, request)

        def done(result: tuple[RemoteEndpoint, str]) -> None:
            ep, where = result
            self.use_endpoint(ep.name)
            if on_done is not None:
                on_done(ep, where)

        op = Operation("endpoint-attach", work, ENDPOINTS)
        self.ctx.ops.run(op, on_success=done, on_failure=on_error)

    def _adopt_remote_url(self, url: str) -> str:
        """Move the old Settings "Remote server" into the attached servers (one way to attach
        a server); returns the endpoint's name, or "" when the URL cannot be attached."""
        try:
            known = self.endpoints.load()
            same = next((e for e in known if e.url == url.strip().rstrip("/")), None)
            if same is not None:
                name = same.name
            else:
                names = {e.name for e in known}
                name = next(
                    n for n in ("remote", *(f"remote-{i}" for i in range(2, 1000)))
                    if n not in names
                )  # fmt: skip
                add_endpoint(self.endpoints, EndpointRequest(name, url, check=False))
            recent = {**self.ctx.settings.recent, RECENT_KEY: name}
            self.ctx.update_settings(remote_url="", recent=recent)
        except K3Error as exc:
            self.ctx.reporter.report(
                K3Error(
                    f"The remote server {url!r} from the settings file could not be moved to "
                    f"the attached servers: {exc.message}",
                    "Attach it on the Cluster page (Attached servers), then remove "
                    '"remote_url" from the settings file.',
                )
            )
            return ""
        return name

    def set_server(
        self,
        name: str,
        server: str | None,
        on_done: Callable[[EndpointStatus], None] | None = None,
    ) -> None:
        """Say what kind of server ``name`` is (None: find out again), then check it."""

        def work(_t: CancelToken) -> EndpointStatus:
            _ep, st = set_endpoint_server(self.endpoints, name, server, check=True)
            assert st is not None
            return st

        def done(st: EndpointStatus) -> None:
            if self.active_endpoint == name:
                self.use_endpoint(name)  # the chat speaks the new dialect from now on
            if on_done is not None:
                on_done(st)

        self.ctx.ops.run(Operation("endpoint-kind", work, ENDPOINTS), on_success=done)

    def detach(self, name: str) -> None:
        def done(_ep: RemoteEndpoint) -> None:
            if self.active_endpoint == name:
                self._set_active("", None, remember=True)

        detach = Operation(
            "endpoint-detach", lambda _t: remove_endpoint(self.endpoints, name), ENDPOINTS
        )
        self.ctx.ops.run(detach, on_success=done)

    def use_endpoint(self, name: str, *, remember: bool = True) -> None:
        """Send the chat to attached server ``name`` ("" = to none) when no engine runs."""
        if not name:
            self._set_active("", None, remember=remember)
            return

        def done(ep: ChatEndpoint) -> None:
            self.endpoint_error = ""
            self._set_active(name, ep, remember=remember)

        def error(exc: BaseException) -> None:
            self.endpoint_error = (
                f"{exc.message} {exc.hint}".strip() if isinstance(exc, K3Error) else str(exc)
            )
            self.ctx.ops.announce(ENDPOINTS)  # the panel says why

        op = Operation("endpoint-use", lambda _t: self.endpoints.chat_endpoint(name))
        self.ctx.ops.run(op, on_success=done, on_failure=error)

    def check_endpoint(self, name: str, on_done: Callable[[EndpointStatus], None]) -> None:
        # what the check found is kept with the endpoint
        op = Operation("endpoint-check", lambda _t: check_endpoint(self.endpoints, name), ENDPOINTS)
        self.ctx.ops.run(op, on_success=on_done)

    def _set_active(self, name: str, ep: ChatEndpoint | None, *, remember: bool) -> None:
        self.active_endpoint = name
        self._active_ep = ep
        if remember:
            recent = dict(self.ctx.settings.recent)
            if name:
                recent[RECENT_KEY] = name
            else:
                recent.pop(RECENT_KEY, None)
            try:
                self.ctx.update_settings(recent=recent)
            except K3Error as exc:
                self.ctx.reporter.report(exc)
        self.ctx.ops.announce(ENDPOINTS)
        self.changed.emit()

    # ---------------------------------------------------------------- chat
    def chat_endpoint(self) -> ChatEndpoint | None:
        """A ready cluster engine, else the attached server chosen for chat, else None."""
        g = self.group
        if g is not None:
            ep = g.endpoint
            if ep is not None:
                return ep
        return self._active_ep

    def state_text(self) -> str:
        g = self.group
        if g is not None and (g.state is not GroupState.STOPPED or self._stopping):
            state = "stopping" if self._stopping else g.state.value
            return f"{self.group_title} on {self.group_cluster}: {state}"
        if self._active_ep is not None:
            return f"Attached server {self.active_endpoint} ({self._active_ep.root})"
        return ""

    def model_text(self) -> str:
        """Which model the chat talks to here, for the chat's header ("" when none)."""
        g = self.group
        if g is not None and g.endpoint is not None:
            return f"{self.group_title} · cluster {self.group_cluster}"
        if self._active_ep is not None:
            return f"whatever {self.active_endpoint} serves · attached server"
        return ""

    def close(self) -> None:
        """Stop the cluster engine now (blocking; app exit)."""
        for task in list(self._probe_tasks.values()):
            task.cancel()
        group, self.group = self.group, None
        if group is not None:
            group.stop()
