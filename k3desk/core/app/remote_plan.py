"""Use-case "plan a shard set on the Hub for hardware H, before downloading it".

The repository is listed at one commit, the set chosen (``--include`` or the only one),
every part's GGUF header read by HTTP ranges into a header twin
(:mod:`k3desk.core.hub.headers`), and the twin checked and planned exactly as a
downloaded set is (:func:`k3desk.core.app.shardplan.plan_shard_set`): the same
validation, the same tier recognition from header facts, the same planner, so the
verdict and figures are those the downloaded files would get.  Not a byte of tensor
data is fetched.  The plan says it rests on the real headers (``basis``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from k3desk.core.app.shardplan import PlanRequest, ShardSetPlan, plan_shard_set
from k3desk.core.errors import HubError, ValidationError
from k3desk.core.hub.discovery import RemoteRepo, RemoteSet, group_sets, list_repo_sets
from k3desk.core.hub.headers import HeaderBudget, HeaderSet, cached_files, read_remote_headers
from k3desk.core.hub.listing import select
from k3desk.core.progress import CancelToken, ProgressCallback, no_progress
from k3desk.core.safepaths import shown
from k3desk.core.units import fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

Basis = Literal["headers", "catalog"]
HEADER_CACHE = "hub-headers"  # under the app's cache folder


def header_cache(services: Services) -> Path:
    return services.paths.cache / HEADER_CACHE


def parse_remote(spec: str) -> tuple[str, str]:
    """'owner/name@rev' -> ('owner/name', 'rev'); no '@' means main."""
    repo, _, rev = spec.strip().partition("@")
    repo = repo.strip().strip("/")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise HubError(
            f"'{shown(spec)}' is not a Hub repository (owner/name, optionally @revision).",
            "Write it as on the Hub, e.g. GrEarl/Kimi-K3-GGUF-IQ1_S or "
            "GrEarl/Kimi-K3-GGUF-IQ1_S@main.",
        )
    return repo, rev.strip() or "main"


@dataclass(frozen=True)
class RemotePlanRequest:
    repo: str
    revision: str = "main"
    include: str | None = None  # selects one set (as `hf download --include`)
    hardware_file: Path | None = None
    ctx: int | None = None
    n_cpu_moe: int | None = None
    endpoint: str | None = None
    token: str | None = None  # None: the saved token (HF_TOKEN, keyring, `hf auth login`)
    # where the download would go (None: the models folder, as `k3desk download --repo`
    # puts it); this machine's free disk is measured there
    download_dir: Path | None = None


@dataclass(frozen=True)
class RemotePlan:
    """A plan for a set on the Hub, from its real headers."""

    remote: RemoteSet
    headers: HeaderSet
    planned: ShardSetPlan
    projectors: tuple[str, ...]  # the repository's mmproj files
    download_dir: Path  # where `k3desk download --repo` puts the set
    basis: Basis = "headers"

    @property
    def download_path(self) -> Path:
        """Part 1 where the download will put it (what ``-m`` takes after the download)."""
        return self.download_dir / self.remote.first_path

    def argv(self) -> list[str]:
        """The plan's llama-server command for the downloaded set (not the twin)."""
        args = list(self.planned.plan.argv())
        if "-m" in args:
            args[args.index("-m") + 1] = str(self.download_path)
        return args

    @property
    def first_part(self) -> Path:
        """Part 1 of the header twin (what `k3desk plan` and llama-fit-params take)."""
        return self.headers.local_paths[0]

    def basis_text(self) -> str:
        h = self.headers
        how = (
            "cached from an earlier read"
            if h.cached
            else f"{fmt_bytes(h.received)} read in {h.requests} range requests"
        )
        return (
            f"from the real headers of all {len(h.parts)} part"
            f"{'s' if len(h.parts) != 1 else ''} at commit {h.revision[:12]} ({how}); "
            "no tensor data was downloaded"
        )


def token_for(token: str | None) -> str | None:
    """``token``, else the one saved (:class:`k3desk.core.hub.tokens.TokenStore`)."""
    if token is not None:
        return token or None
    from k3desk.core.hub.tokens import TokenStore

    return TokenStore().get()


def choose_set(listed: RemoteRepo, include: str | None) -> RemoteSet:
    """The one set ``include`` selects (or the only set), with a clear message otherwise."""
    sets = [s for s in listed.sets if s.parts]
    if include:
        sets = [s for s in sets if select([s.first_path], [include])]
    names = ", ".join(f"{shown(s.include, 120)} ({s.count} parts)" for s in sets[:8])
    where = f"{shown(listed.repo, 120)} at {shown(listed.revision[:12])}"
    if not sets:
        every = ", ".join(shown(s.include, 120) for s in listed.sets[:8]) or "none"
        raise HubError(
            f"No GGUF model in {where} matches {shown(include)!r}."
            if include
            else f"{where} holds no GGUF model.",
            f"Its models: {every}." if listed.sets else "Pick another repository.",
        )
    if len(sets) > 1:
        raise HubError(
            f"{where} holds {len(sets)} models"
            f"{' matching ' + repr(shown(include)) if include else ''}: "
            f"{names}.",
            "Pick one with --include PATTERN (e.g. the pattern shown for it).",
        )
    chosen = sets[0]
    if chosen.missing:
        numbers = ", ".join(str(i) for i in chosen.missing[:10])
        plural = "s" if len(chosen.missing) > 1 else ""
        raise HubError(
            f"{shown(chosen.name, 120)} in {where} lacks part{plural} "
            f"{numbers} of {chosen.count}: the set cannot load.",
            "Pick another set, or wait until the publisher finishes the upload.",
        )
    return chosen


def plan_remote_set(
    services: Services,
    request: RemotePlanRequest,
    *,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
) -> RemotePlan:
    """List, read the headers of and plan one set on the Hub (see the module docstring)."""
    request = replace(request, token=token_for(request.token))
    try:
        listed = list_repo_sets(
            request.repo, request.revision, endpoint=request.endpoint, token=request.token
        )
    except HubError:
        # the Hub out of reach: a commit whose headers were read before is still planned
        cached = cached_files(
            header_cache(services), request.endpoint, request.repo, request.revision
        )
        if not cached:
            raise
        listed = group_sets(request.repo, request.revision, cached)
    chosen = choose_set(listed, request.include)
    return plan_listed_set(services, request, listed, chosen, progress=progress, cancel=cancel)


def plan_listed_set(
    services: Services,
    request: RemotePlanRequest,
    listed: RemoteRepo,
    chosen: RemoteSet,
    *,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    budget: HeaderBudget | None = None,
) -> RemotePlan:
    """Read the headers of ``chosen`` (listed at ``listed.revision``) and plan it; what
    is received counts in ``budget`` too (a search's), whatever the outcome."""
    headers = read_remote_headers(
        listed.repo,
        listed.revision,
        chosen.parts,
        header_cache(services),
        endpoint=request.endpoint or listed.listing.endpoint or None,
        token=request.token,
        progress=progress,
        cancel=cancel,
        budget=budget,
    )
    try:
        planned = plan_shard_set(
            services,
            PlanRequest(
                headers.local_paths[0],
                hardware_file=request.hardware_file,
                ctx=request.ctx,
                n_cpu_moe=request.n_cpu_moe,
                disk_path=request.download_dir or services.paths.models_dir,
            ),
        )
    except ValidationError as exc:
        # the twin holds the Hub's headers: the advice is about the Hub's files
        raise ValidationError(
            f"{shown(listed.repo, 120)} at {shown(listed.revision[:12])}, "
            f"{shown(chosen.name, 120)}: {exc.message}",
            "No llama.cpp build can load this set as published; nothing was downloaded. "
            "Pick another set.",
        ) from None
    target = request.download_dir or services.paths.models_dir / listed.repo.replace("/", "--")
    return RemotePlan(chosen, headers, planned, tuple(f.path for f in listed.projectors), target)


# ------------------------------------------------------------------ the engine's own figures

FIT_PARAMS = "llama-fit-params"
# the plan's llama-server arguments llama-fit-params takes too (it refuses server-only
# ones such as --jinja and --no-warmup: tools/fit-params in llama.cpp b11434 parses the
# common arguments only)
_FIT_FLAGS = frozenset(
    ("-ngl", "--n-cpu-moe", "-c", "-ctk", "-ctv", "-fa", "--parallel", "-ts", "-sm", "-mg",
     "-ot", "-b", "-ub")
)  # fmt: skip


@dataclass(frozen=True)
class EngineMemory:
    """llama.cpp's own estimate for one device, MiB (``llama-fit-params --fit-print on``)."""

    device: str
    model: int
    context: int
    compute: int


@dataclass(frozen=True)
class EngineEstimate:
    tool: Path
    args: tuple[str, ...]
    devices: tuple[EngineMemory, ...]


def fit_params_args(server_args: Sequence[str]) -> list[str]:
    """The plan's arguments llama-fit-params understands, ``-m`` first."""
    args = list(server_args)
    out: list[str] = []
    for i, a in enumerate(args[:-1]):
        if a == "-m" or a in _FIT_FLAGS:
            out += [a, args[i + 1]]
    return out


def engine_estimate(
    services: Services, planned: ShardSetPlan, timeout: float = 300.0
) -> EngineEstimate | None:
    """What the engine's ``llama-fit-params`` (beside llama-server) says the plan's launch
    needs per device on this machine, measured on the header twin with no data loaded
    (``no_alloc``); None when there is no such tool.  Raises EngineError when it fails."""
    import subprocess

    from k3desk.core.engines.discovery import find_llama_server
    from k3desk.core.errors import EngineError
    from k3desk.core.process import run as run_program

    server = find_llama_server(services.paths, services.configured_engine())
    if server is None or not (server.parent / FIT_PARAMS).is_file():
        return None
    tool = server.parent / FIT_PARAMS
    args = [*fit_params_args(planned.plan.argv()[1:]), "--fit-print", "on"]
    try:
        done = run_program([str(tool), *args], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineError(f"{FIT_PARAMS} did not finish: {exc}.") from None
    devices = []
    for line in done.stdout.splitlines():
        cells = line.split()
        if len(cells) == 4 and all(c.isdigit() for c in cells[1:]):
            devices.append(EngineMemory(cells[0], int(cells[1]), int(cells[2]), int(cells[3])))
    if done.returncode != 0 or not devices:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineError(
            f"{FIT_PARAMS} could not judge {Path(args[1]).name} (exit {done.returncode}): "
            f"{last[-300:]}",
            "The engine's own estimate is missing; k3desk's plan above still stands.",
        )
    return EngineEstimate(tool, tuple(args), tuple(devices))
