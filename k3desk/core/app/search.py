"""Use-case "what does the Hub have": Kimi-K3 GGUF sets, each with a verdict for hardware H.

The Hub is searched (:func:`k3desk.core.hub.discovery.search_repos`), each repository
listed at its commit and grouped into shard sets, and each set judged:

* from its **real headers** (read by ranges into a header twin, cached per commit,
  :mod:`k3desk.core.app.remote_plan`): the same check and plan as a downloaded set;
* else from the **catalog**, where the set is a catalog tier's files (same repository,
  the tier's file pattern): the catalog's estimate, said to be one;
* else it is listed unjudged.

A set that matches a catalog tier carries the card's facts (quality figures, caveats,
the engine it needs).

One search reads at most :data:`SEARCH_HEADER_BUDGET` bytes of headers, every byte that
arrives counted (a set refused or failed counts what it cost: ``SetRow.header_bytes``),
and lists repositories for at most :data:`SEARCH_SECONDS`; past either, the rest is
listed from the catalog or unjudged, and says so.  Ids and names from the Hub are shown
bounded (:func:`k3desk.core.safepaths.shown`).

With ``HF_HUB_OFFLINE`` set, or the Hub unreachable, the result is the catalog alone
and says so (:attr:`SearchResult.offline`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from k3desk.core.app.remote_plan import RemotePlan, RemotePlanRequest, plan_listed_set, token_for
from k3desk.core.app.subject import Subject, judged_machine
from k3desk.core.app.tiers import TierJudgement, TierRequest, TierRow, judge_tiers
from k3desk.core.catalog.model import Tier
from k3desk.core.errors import Cancelled, K3Error
from k3desk.core.hub.discovery import (
    DEFAULT_QUERY,
    RemoteRepo,
    RemoteSet,
    RepoHit,
    list_repo_sets,
    search_repos,
)
from k3desk.core.hub.headers import BudgetSpent, HeaderBudget, header_budget
from k3desk.core.hub.listing import resolve_endpoint, select
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress
from k3desk.core.safepaths import shown
from k3desk.core.units import fmt_bytes

__all__ = [
    "SEARCH_HEADER_BUDGET",
    "SearchRequest",
    "SearchResult",
    "SetRow",
    "search_hub",
    "shown",  # what the shells show of the Hub's text goes through it
    "size_text",
]

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

Basis = Literal["headers", "catalog", "none"]
# What one search may read of headers (about 5 MiB a set: part 1 holds the tokenizer);
# sets past it are judged from the catalog, or listed, with a note how to plan them
SEARCH_HEADER_BUDGET = 256 * 1024 * 1024
SEARCH_HEADER_SECONDS = 600.0  # reading headers, all sets together
SEARCH_SECONDS = 900.0  # listing repositories, all together


@dataclass(frozen=True)
class SearchRequest:
    query: str = DEFAULT_QUERY
    base_model: str | None = None
    hardware_file: Path | None = None
    read_headers: bool = True  # judge each set from its real headers (cached per commit)
    endpoint: str | None = None
    token: str | None = None  # None: the saved token
    limit: int = 20  # repositories


@dataclass(frozen=True)
class SetRow:
    """One set on the Hub, judged."""

    hit: RepoHit
    remote: RemoteSet
    tier: Tier | None  # the catalog tier it is (by its headers, else by its file names)
    basis: Basis  # what the verdict rests on
    verdict: str  # in the words every shell uses ("hybrid: 45 expert layers on CPU", ...)
    kind: str  # the planner's verdict kind ("gpu", "hybrid", ..., "" when not judged)
    n_cpu_moe: int | None = None
    speed: str = ""  # '13 tok/s'
    problem: str = ""  # why it could not be judged from its headers
    suspicious: tuple[str, ...] = ()
    header_bytes: int = 0  # bytes read from the Hub for its headers in this search
    projectors: tuple[str, ...] = ()
    plan: RemotePlan | None = None

    @property
    def repo(self) -> str:
        return self.remote.repo

    @property
    def revision(self) -> str:
        return self.remote.revision

    def basis_text(self) -> str:
        if self.basis == "headers":
            return "real headers"
        if self.basis == "catalog":
            return "catalog estimate"
        return "not judged"


@dataclass(frozen=True)
class SearchResult:
    endpoint: str
    query: str
    subject: Subject
    rows: tuple[SetRow, ...]
    # the catalog judged for the same machine: what is shown when the Hub is not reached
    catalog: TierJudgement
    offline: bool = False
    offline_reason: str = ""
    errors: tuple[str, ...] = ()  # repositories that could not be listed, one line each

    @property
    def status(self) -> str:
        if self.offline:
            return f"catalog only (offline): {self.offline_reason}"
        sets = len(self.rows)
        repos = len({r.repo for r in self.rows})
        return (
            f"{sets} set{'s' if sets != 1 else ''} in {repos} repositor"
            + ("y" if repos == 1 else "ies")
            + f" on {self.endpoint}"
        )


def size_text(n: int) -> str:
    """A set's or a tier's bytes as every shell shows them ('528.0 GiB')."""
    return fmt_bytes(n)


def catalog_tier_for(remote: RemoteSet, tiers: tuple[Tier, ...]) -> Tier | None:
    """The catalog tier whose files ``remote`` is, by repository and file pattern."""
    for tier in tiers:
        if tier.repo.lower() != remote.repo.lower():
            continue
        if select([remote.first_path], list(tier.include)) and (
            remote.count == tier.shard_count or "shard_count" in tier.derived
        ):
            return tier
    return None


def _catalog_row(hit: RepoHit, remote: RemoteSet, tier: Tier, row: TierRow | None) -> SetRow:
    if row is None:
        return SetRow(hit, remote, tier, "none", "not judged", "")
    return SetRow(
        hit,
        remote,
        tier,
        "catalog",
        row.label,
        row.kind,
        n_cpu_moe=row.n_cpu_moe,
        speed=row.speed.text() if row.speed is not None else "",
    )


def _header_row(hit: RepoHit, remote: RemoteSet, planned: RemotePlan) -> SetRow:
    p = planned.planned
    s = p.view.speed
    return SetRow(
        hit,
        remote,
        p.tier,
        "headers",
        p.view.label,
        p.plan.verdict,
        n_cpu_moe=p.plan.n_cpu_moe,
        speed=s.text() if p.plan.verdict in ("gpu", "hybrid", "cpu", "stream") else "",
        suspicious=p.suspicious,
        header_bytes=planned.headers.received,
        projectors=planned.projectors,
        plan=planned,
    )


def _base_row(hit: RepoHit, remote: RemoteSet, tier: Tier | None, row: TierRow | None) -> SetRow:
    """The catalog's judgement of the set's tier, or 'not judged' when it has none."""
    if tier is not None:
        return _catalog_row(hit, remote, tier, row)
    return SetRow(hit, remote, None, "none", "not judged", "")


def _row_without_headers(
    request: SearchRequest,
    hit: RepoHit,
    remote: RemoteSet,
    tier: Tier | None,
    tier_row: TierRow | None,
    spent: HeaderBudget,
) -> SetRow | None:
    """The row of a set whose headers are not read (not asked for, parts missing, or the
    search's header budget spent); None when its headers are to be read."""
    over = spent.used >= spent.limit or spent.spent
    if request.read_headers and remote.complete and not over:
        return None
    if over and remote.complete and request.read_headers:
        return replace(
            _base_row(hit, remote, tier, tier_row),
            problem=f"headers not read: this search read {fmt_bytes(spent.used)} "
            "already; `k3desk plan --remote` reads them",
        )
    if tier is not None:
        return _catalog_row(hit, remote, tier, tier_row)
    why = f"parts missing: {', '.join(map(str, remote.missing[:5]))}" if remote.missing else ""
    return SetRow(hit, remote, None, "none", "not judged", "", problem=why)


def _row_from_headers(
    services: Services,
    plan_req: RemotePlanRequest,
    listed: RemoteRepo,
    found: tuple[RepoHit, RemoteSet, Tier | None, TierRow | None],
    progress: ProgressCallback,
    cancel: CancelToken | None,
    budget: HeaderBudget,
) -> SetRow:
    """The row of a set judged from its headers, with the header bytes read for it
    (counted in ``budget``, the search's, whatever the outcome); a set whose headers
    cannot load keeps the catalog's verdict, with the reason."""
    hit, remote, tier, tier_row = found
    before = budget.used
    try:
        planned = plan_listed_set(
            services, plan_req, listed, remote, progress=progress, cancel=cancel, budget=budget
        )
    except Cancelled:
        raise
    except BudgetSpent as exc:  # the search's budget ran out while reading this set
        base = _base_row(hit, remote, tier, tier_row)
        problem = f"headers not read in full: {exc.message} {exc.hint}"
        return replace(base, problem=problem, header_bytes=budget.used - before)
    except K3Error as exc:
        base = _base_row(hit, remote, tier, tier_row)
        verdict = base.verdict if base.basis == "catalog" else "n/a: its headers cannot load"
        return replace(
            base, problem=exc.message, verdict=verdict, header_bytes=budget.used - before
        )
    return replace(_header_row(hit, remote, planned), header_bytes=budget.used - before)


def offline_reason() -> str:
    """Why the Hub is not asked at all ('' when it is)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    return ""


def search_hub(
    services: Services,
    request: SearchRequest,
    *,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
) -> SearchResult:
    """Search the Hub and judge every set found (see the module docstring)."""
    request = replace(request, token=token_for(request.token))
    hw, subject = judged_machine(services, request.hardware_file)
    tiers = services.catalog_tiers()
    catalog = judge_tiers(TierRequest(hw, subject, state_dir=services.paths.state), tiers)
    ep = resolve_endpoint(request.endpoint)
    reason = offline_reason()
    if reason:
        return SearchResult(ep, request.query, subject, (), catalog, True, reason)
    progress(Progress("Searching the Hub", 0, 0, shown(request.query, 60)))
    errors: list[str] = []
    try:
        hits = search_repos(
            request.query,
            base_model=request.base_model,
            endpoint=ep,
            token=request.token,
            limit=request.limit,
            refused=errors,
        )
    except K3Error as exc:
        return SearchResult(ep, request.query, subject, (), catalog, True, exc.message)
    if cancel is not None:
        cancel.raise_if_cancelled()
    rows = _judge_hits(services, request, ep, hits, (tiers, catalog), errors, progress, cancel)
    progress(Progress("Searching the Hub", 1, 1))
    return SearchResult(ep, request.query, subject, tuple(rows), catalog, errors=tuple(errors))


def _judge_hits(
    services: Services,
    request: SearchRequest,
    ep: str,
    hits: list[RepoHit],
    known: tuple[tuple[Tier, ...], TierJudgement],
    errors: list[str],
    progress: ProgressCallback,
    cancel: CancelToken | None,
) -> list[SetRow]:
    """Every set of every repository found, judged (within the search's bounds)."""
    tiers, catalog = known
    rows: list[SetRow] = []
    spent = header_budget(SEARCH_HEADER_BUDGET, SEARCH_HEADER_SECONDS)
    deadline = time.monotonic() + SEARCH_SECONDS
    by_tier = {r.tier.id: r for r in catalog.rows}
    plan_req = RemotePlanRequest(
        repo="",
        hardware_file=request.hardware_file,
        endpoint=ep,
        token=request.token,
    )
    for n, hit in enumerate(hits):
        if cancel is not None:
            cancel.raise_if_cancelled()
        if time.monotonic() > deadline:
            errors.append(
                f"the search took longer than {SEARCH_SECONDS:g} s; {len(hits) - n} "
                "repositories were not listed (search for one of them by name)"
            )
            break
        progress(Progress("Listing repositories", n, len(hits), shown(hit.repo, 60)))
        try:
            listed: RemoteRepo = list_repo_sets(
                hit.repo, hit.revision or "main", endpoint=ep, token=request.token
            )
        except K3Error as exc:
            errors.append(f"{shown(hit.repo, 120)}: {shown(exc.message, 600)}")
            continue
        for remote in listed.sets:
            tier = catalog_tier_for(remote, tiers)
            tier_row = by_tier.get(tier.id) if tier is not None else None
            row = _row_without_headers(request, hit, remote, tier, tier_row, spent)
            if row is None:
                found = (hit, remote, tier, tier_row)
                row = _row_from_headers(services, plan_req, listed, found, progress, cancel, spent)
            rows.append(row)
    return rows
