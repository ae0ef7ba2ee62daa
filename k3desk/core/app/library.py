"""Use-case "my models": the GGUF sets a person already has, added by hand or found in the
model folders of Settings, each checked from its headers and judged for a machine.

``k3desk models add/list/remove`` and the Models page's "My models" both call this.
The list of what was added lives in one private JSON file (:class:`ModelLibrary`,
replaced atomically); the files themselves are never moved or written.

A set is checked as a launch checks it (:func:`~k3desk.core.gguf.validate.inspect_shard_set`:
every part's header, the split keys, the kimi-k3 tensors), recognised as a catalog tier
by its header facts (:mod:`k3desk.core.catalog.identify`), and paired with the vision
projector beside it once that file's header shows it is one
(:func:`~k3desk.core.engines.launch.projector_bytes`).  Its verdict is the planner's, in
the words of the tiers table (:func:`~k3desk.core.app.tiers.plan_label`).

Bad input (a missing path, a file that is not a GGUF, a set with a part missing, a folder
without a model) is refused with what is wrong, and the list is left as it was.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from k3desk.core.app.models import find_models, is_projector
from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import RUNS, SpeedRange, plan_label
from k3desk.core.catalog.identify import TierMatch, identify_tier
from k3desk.core.catalog.model import Tier
from k3desk.core.errors import K3Error, ValidationError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.reader import read_header
from k3desk.core.gguf.shards import discover
from k3desk.core.gguf.validate import inspect_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.hub.state import meta_dir
from k3desk.core.planning.model import DEFAULT_CTX, LaunchPlan, PlanOptions
from k3desk.core.private import private_dir, write_private
from k3desk.core.tuning.calibration import CalibrationStore, calibrate_plan
from k3desk.core.tuning.cpuprobe import kept_scale
from k3desk.core.units import fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

LIBRARY_SCHEMA = 1
Source = Literal["added", "folder"]


class LibraryError(K3Error):
    """A model cannot be added or removed, or the list of models cannot be read."""


@dataclass(frozen=True)
class LocalModel:
    """One shard set on disk, checked from its headers."""

    id: str  # short and stable: from part 1's absolute path
    shard: Path  # part 1, what llama-server is given
    name: str  # the set's own name: part 1's file name without the split suffix
    parts: int
    size_bytes: int  # the parts' bytes on disk
    projector: Path | None  # the vision projector paired with it (its header checked)
    source: Source  # added by hand, or found in a model folder of Settings
    origin: Path  # the path that was added, or the folder it was found in
    tier: TierMatch | None = None  # the catalog tier it is, by header facts
    problem: str = ""  # why it cannot be used ('' = it can)
    suspicious: tuple[str, ...] = ()  # what llama.cpp b11434 would refuse in it
    layout: ModelLayout | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not self.problem

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "shard": str(self.shard),
            "parts": self.parts,
            "size_bytes": self.size_bytes,
            "size": fmt_bytes(self.size_bytes),
            "projector": str(self.projector) if self.projector is not None else None,
            "vision": self.projector is not None,
            "source": self.source,
            "origin": str(self.origin),
            "tier": self.tier.tier.id if self.tier is not None else None,
            "tier_facts": self.tier.text() if self.tier is not None else None,
            "problem": self.problem or None,
            "suspicious": list(self.suspicious),
        }


@dataclass(frozen=True)
class ModelRow:
    """A local model judged for one machine: the Models page's row, ``k3desk models list``'s."""

    model: LocalModel
    label: str  # the verdict in the tiers table's words, or why it cannot be used
    kind: str  # the planner's verdict ("gpu", "hybrid", "cpu", "stream", "no-fit"), or ""
    speed: SpeedRange | None  # only for a model that runs there
    plan: LaunchPlan | None

    @property
    def runs(self) -> bool:
        return self.kind in RUNS

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.model.to_dict(),
            "verdict": self.label,
            "verdict_kind": self.kind or None,
            "runs": self.runs,
            "speed": self.speed.text() if self.speed is not None else None,
            "speed_tps": round(self.speed.expected, 3) if self.speed is not None else None,
            "speed_range": self.speed.range_text() if self.speed is not None else None,
        }


@dataclass(frozen=True)
class ModelsJudgement:
    subject: Subject
    rows: tuple[ModelRow, ...]
    problems: tuple[str, ...] = ()  # e.g. a model folder of Settings that is missing

    def row(self, key: str) -> ModelRow | None:
        """The row whose id or part-1 path is ``key``."""
        return next((r for r in self.rows if key in (r.model.id, str(r.model.shard))), None)


def model_id(shard: Path) -> str:
    return hashlib.sha1(str(shard.absolute()).encode("utf-8", "surrogateescape")).hexdigest()[:10]


# ------------------------------------------------------------------ the stored list
class ModelLibrary:
    """The paths added to "My models" (files: part 1 of a set; folders), one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[Path]:
        if not self.path.exists():
            return []
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            entries = raw["models"] if isinstance(raw, dict) else None
            if not isinstance(entries, list):
                raise ValueError("no 'models' list")
            return [Path(str(e["path"])) for e in entries]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise LibraryError(
                f"The list of your models ({self.path}) cannot be read: {exc}",
                "Fix the JSON by hand, or delete the file and add your models again.",
            ) from exc

    def save(self, paths: Sequence[Path]) -> None:
        data = {
            "schema": LIBRARY_SCHEMA,
            "models": [{"path": str(p), "added": int(time.time())} for p in paths],
        }
        private_dir(self.path.parent)
        write_private(self.path, json.dumps(data, indent=2) + "\n")


def library(services: Services) -> ModelLibrary:
    return ModelLibrary(services.paths.data / "models.json")


# ---------------------------------------------------------------- checking a set
def _projector_beside(shard: Path) -> Path | None:
    """The vision projector in part 1's folder: a ``mmproj`` file whose header is a
    projector's (``general.architecture`` 'clip'); the first such one by name.  For a set
    k3desk downloaded, none there, the folder it downloaded the set into: a repository
    keeps its projector at its top and the parts in the set's folder, and the download
    keeps that layout (:func:`k3desk.core.app.hub_choice.projector_hint` looks there too)."""
    try:
        candidates = sorted(p for p in shard.parent.glob("*.gguf") if is_projector(p))
        if not candidates:
            folder = next((d for d in shard.parents if meta_dir(d).is_dir()), None)
            if folder is not None:
                candidates = sorted(p for p in folder.rglob("*.gguf") if is_projector(p))
    except OSError:
        return None
    for p in candidates:
        try:
            if read_header(p).get("general.architecture") == "clip":
                return p
        except (ValidationError, OSError):
            continue
    return None


def inspect_model(
    shard: Path, tiers: Sequence[Tier], source: Source = "added", origin: Path | None = None
) -> LocalModel:
    """Check the set ``shard`` belongs to from its headers; a broken set comes back with
    its problem (never raised), so a folder with one bad set still lists the others."""
    sset = discover(shard)
    first = sset.directory / sset.part_name(0)
    origin = origin if origin is not None else first
    try:
        report = inspect_shard_set(first if first.exists() else shard, tiers=tiers)
    except ValidationError as exc:
        size = sum(p.stat().st_size for p in sset.paths if p.is_file())
        return LocalModel(
            model_id(first),
            first,
            sset.prefix,
            sset.count,
            size,
            None,
            source,
            origin,
            problem=f"{exc.message} {exc.hint}".strip(),
        )
    except OSError as exc:
        return LocalModel(
            model_id(first),
            first,
            sset.prefix,
            sset.count,
            0,
            None,
            source,
            origin,
            problem=f"{first} cannot be read: {exc.strerror or exc}.",
        )
    layout = report.layout
    match = identify_tier(layout, tiers)
    return LocalModel(
        model_id(layout.first_part),
        layout.first_part,
        sset.prefix,
        len(layout.parts),
        sum(layout.part_sizes),
        _projector_beside(layout.first_part),
        source,
        origin,
        match,
        suspicious=report.suspicious,
        layout=layout,
    )


# A folder is looked at only up to this many sets (each costs a header read): a folder
# of 10,000 GGUF-named files answers in a second, not in a quarter of a minute.
MAX_FOLDER_SETS = 500
# Problems named in one message; the rest are counted.
MAX_PROBLEMS_SHOWN = 5


def scan(path: Path, tiers: Sequence[Tier], source: Source) -> list[LocalModel]:
    """The sets at ``path``: the one a file belongs to, or every set under a folder (the
    first ``MAX_FOLDER_SETS`` of them)."""
    if path.is_dir():
        sets = find_models(path)[:MAX_FOLDER_SETS]
        return [inspect_model(f.shard, tiers, source, path) for f in sets]
    return [inspect_model(path, tiers, source, path)]


def problems_text(problems: Sequence[str]) -> str:
    """The first few problems, each shortened, and how many more there are."""
    shown = [p if len(p) <= 300 else p[:297] + "..." for p in problems[:MAX_PROBLEMS_SHOWN]]
    more = len(problems) - len(shown)
    return " ".join(shown) + (f" (and {more:,} more like these)" if more > 0 else "")


def _missing(path: Path, source: Source) -> LocalModel:
    what = "folder" if source == "folder" else "path"
    return LocalModel(
        model_id(path),
        path,
        path.name,
        0,
        0,
        None,
        source,
        path,
        problem=f"The {what} {path} no longer exists (moved, deleted, or a drive not mounted).",
    )


def settings_folders(services: Services) -> list[Path]:
    """The model folders of Settings, and the download folder (where tiers arrive)."""
    from k3desk.core.settings import SettingsError

    try:
        s = services.settings()
    except SettingsError:
        return [services.paths.models_dir]
    folders = [Path(d).expanduser() for d in s.model_dirs if d.strip()]
    folders.append(s.effective_download_dir(services.paths.models_dir))
    out: list[Path] = []
    for f in folders:
        if f not in out:
            out.append(f)
    return out


def local_models(services: Services) -> tuple[tuple[LocalModel, ...], tuple[str, ...]]:
    """Every set added by hand, then every one in the model folders of Settings (each
    once), and the problems of the folders themselves."""
    tiers = services.catalog_tiers()
    found: dict[Path, LocalModel] = {}
    problems: list[str] = []
    for path in library(services).load():
        models = scan(path, tiers, "added") if path.exists() else [_missing(path, "added")]
        for m in models:
            found.setdefault(m.shard, m)
    for folder in settings_folders(services):
        if not folder.exists():
            if folder != services.paths.models_dir:
                problems.append(f"The model folder {folder} (Settings) does not exist.")
            continue
        for m in scan(folder, tiers, "folder"):
            found.setdefault(m.shard, m)
    return tuple(found.values()), tuple(problems)


# ------------------------------------------------------------------- judging them
def judge_model(
    model: LocalModel,
    hw: HardwareProfile,
    options: PlanOptions,
    calibration: CalibrationStore | None = None,
    since: float = 0.0,
) -> ModelRow:
    """The planner's verdict on ``model`` for ``hw``, in the tiers table's words (its
    speed with this machine's correction from ``calibration``, where it has runs from
    ``since`` on: when this CPU's kernels were timed, see ``judge_models``)."""
    from k3desk.core.engines.launch import plan_model

    if model.layout is None:
        return ModelRow(model, f"can't use: {model.problem}", "", None, None)
    opts = options
    if model.projector is not None:
        from dataclasses import replace

        opts = replace(options, mmproj=model.projector)
    tiers = (model.tier.tier,) if model.tier is not None else ()
    try:
        plan, _tier = plan_model(hw, model.layout, opts, tiers)
    except K3Error as exc:
        return ModelRow(model, f"n/a: {exc.message}", "", None, None)
    speed = None
    if plan.verdict in RUNS:
        plan = calibrate_plan(calibration, hw, model.layout, plan, since)
        s = plan.speed
        speed = SpeedRange(
            s.expected_tps, s.low_tps, s.high_tps, s.bottleneck, s.calibrated_tps, s.calibration
        )
    return ModelRow(model, plan_label(plan), plan.verdict, speed, plan)


def judge_models(
    models: Iterable[LocalModel],
    hw: HardwareProfile,
    subject: Subject,
    *,
    ctx: int = DEFAULT_CTX,
    problems: tuple[str, ...] = (),
    state_dir: Path | None = None,
) -> ModelsJudgement:
    # with the state folder, this CPU's kernel speed where it was timed (and only the
    # runs since then correct it: core/tuning/cpuprobe.py)
    scale, since = kept_scale(state_dir, hw)
    options = PlanOptions(ctx=None, default_ctx=ctx, kernel_scale=scale)
    store = CalibrationStore(state_dir) if state_dir is not None else None
    rows = tuple(judge_model(m, hw, options, store, since) for m in models)
    return ModelsJudgement(subject, rows, problems)


def list_models(
    services: Services, hw: HardwareProfile, subject: Subject, *, ctx: int = DEFAULT_CTX
) -> ModelsJudgement:
    """Every local model judged for ``hw`` (the page's machine, or this one)."""
    models, problems = local_models(services)
    return judge_models(
        models, hw, subject, ctx=ctx, problems=problems, state_dir=services.paths.state
    )


# ---------------------------------------------------------------- add and remove
@dataclass(frozen=True)
class AddResult:
    added: tuple[LocalModel, ...]  # the usable sets the path brought
    skipped: tuple[LocalModel, ...]  # sets under a folder that cannot be used
    already: bool  # the path was in the list already (nothing changed)
    path: Path  # what was stored


def add_model(services: Services, path: str | Path) -> AddResult:
    """Add a GGUF file (any part of a set) or a folder of sets to "My models".

    Raises :class:`LibraryError` (and stores nothing) for a missing path, a file that is
    not a usable model, a projector on its own, or a folder without a usable set.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise LibraryError(
            f"{p} does not exist.", "Choose a .gguf file (any part of the set) or its folder."
        )
    p = p.absolute()
    tiers = services.catalog_tiers()
    if p.is_dir():
        count = len(find_models(p))
        if count > MAX_FOLDER_SETS:
            raise LibraryError(
                f"{p} holds {count:,} GGUF sets; k3desk adds a folder of at most "
                f"{MAX_FOLDER_SETS} at once.",
                "Add the folder that holds the model itself, or the model's first shard.",
            )
        models = scan(p, tiers, "added")
        if not models:
            raise LibraryError(
                f"No GGUF model in {p}.",
                "Choose the folder that holds the .gguf shards (folders inside it are "
                "searched too).",
            )
        good = tuple(m for m in models if m.ok)
        bad = tuple(m for m in models if not m.ok)
        if not good:
            raise LibraryError(
                f"No usable model in {p}: " + problems_text([m.problem for m in bad]), ""
            )
        stored = p
    else:
        if not p.is_file():
            raise LibraryError(f"{p} is not a file or a folder.", "Choose a .gguf file.")
        if is_projector(p) and _is_clip(p):
            raise LibraryError(
                f"{p.name} is a vision projector, not a model.",
                "Add the model's first shard (or its folder): the projector beside it is "
                "paired with it.",
            )
        m = inspect_model(p, tiers, "added")
        if not m.ok:
            raise LibraryError(f"{p.name} cannot be added: {m.problem}", "")
        good, bad = (m,), ()
        stored = m.shard
    lib = library(services)
    entries = lib.load()
    already = stored in entries or any(m.shard == e for m in good for e in entries)
    if not already:
        lib.save([*entries, stored])
    return AddResult(good, bad, already, stored)


def _is_clip(path: Path) -> bool:
    try:
        return read_header(path).get("general.architecture") == "clip"
    except (ValidationError, OSError):
        return False


def remove_model(services: Services, key: str) -> Path:
    """Take a path (or a model's id) off "My models"; the files stay where they are.

    Returns the entry removed.  A set found in a model folder of Settings is not on the
    list: the message says to remove the folder there.
    """
    lib = library(services)
    entries = lib.load()
    p = Path(key).expanduser()
    wanted = p.absolute() if p.exists() or p.is_absolute() or "/" in key else None
    for e in entries:
        if wanted is not None and (e in (wanted, p)):
            lib.save([x for x in entries if x != e])
            return e
    models, _ = local_models(services)
    for m in models:
        if key == m.id or (wanted is not None and m.shard == wanted):
            if m.source == "folder":
                raise LibraryError(
                    f"{m.name} is found in the model folder {m.origin}, set in Settings.",
                    "Remove the folder under Settings > Model folders to stop listing it.",
                )
            lib.save([x for x in entries if x != m.origin])
            return m.origin
    raise LibraryError(
        f"{key} is not in your models.", "`k3desk models list` shows their ids and paths."
    )
