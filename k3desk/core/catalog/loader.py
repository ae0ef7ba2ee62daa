"""Load and check ``resources/catalog.json``: the tiers k3desk knows about.

Every problem in the file is reported as one :class:`CatalogError` naming the
tier and the field, so a bad edit to the data never surfaces as a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

from k3desk.core.catalog.model import (
    KNOWN_FORKS,
    ROLES,
    Engine,
    QualityFigure,
    SpeedReport,
    TensorOverride,
    Tier,
    VisionSupport,
)
from k3desk.core.errors import CatalogError
from k3desk.core.gguf.ggml import BY_NAME
from k3desk.core.gguf.shards import parse_split_name

_GGML_TYPES = frozenset(BY_NAME)
_TOP_KEYS = frozenset({"format", "about", "common_caveats", "tiers"})


class Catalog:
    """The tiers of one catalog file, in the file's order."""

    def __init__(self, tiers: tuple[Tier, ...], common_caveats: tuple[str, ...] = ()) -> None:
        self.tiers = tiers
        self.common_caveats = common_caveats
        self._by_id = {t.id: t for t in tiers}

    def __iter__(self) -> Iterator[Tier]:
        return iter(self.tiers)

    def __len__(self) -> int:
        return len(self.tiers)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(t.id for t in self.tiers)

    def get(self, tier_id: str) -> Tier:
        try:
            return self._by_id[tier_id]
        except KeyError:
            raise CatalogError(
                f"Unknown tier '{tier_id}'.",
                "Valid tier ids: " + ", ".join(self.ids) + " (see `k3desk tiers`).",
            ) from None

    def to_json_list(self) -> list[dict[str, Any]]:
        """Every tier as plain JSON data (what ``k3desk tiers --json`` prints)."""
        return [_jsonable(dataclasses.asdict(t)) for t in self.tiers]


def load_catalog(path: Path | str) -> Catalog:
    """Read and validate a catalog file; raise :class:`CatalogError` on any problem."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CatalogError(
            f"Tier catalog {p} does not exist.",
            "Reinstall k3desk, or point K3DESK_RESOURCES at a folder holding catalog.json.",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"Cannot read tier catalog {p}: {exc}.") from None
    except json.JSONDecodeError as exc:
        raise CatalogError(
            f"Tier catalog {p} is not valid JSON: {exc.msg} at line {exc.lineno}, "
            f"column {exc.colno}.",
            "Fix the file or reinstall k3desk.",
        ) from None
    return parse_catalog(raw, str(p))


def parse_catalog(raw: object, where: str = "catalog") -> Catalog:
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: the top level must be an object with a 'tiers' list.")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise CatalogError(f"{where}: unknown top-level key(s) {', '.join(unknown)}.")
    tiers_raw = raw.get("tiers")
    if not isinstance(tiers_raw, list) or not tiers_raw:
        raise CatalogError(f"{where}: 'tiers' must be a non-empty list.")
    common = raw.get("common_caveats", [])
    if not isinstance(common, list) or not all(isinstance(c, str) for c in common):
        raise CatalogError(f"{where}: 'common_caveats' must be a list of strings.")
    tiers: list[Tier] = []
    seen: set[str] = set()
    for i, item in enumerate(tiers_raw):
        tier = _parse_tier(item, f"{where}: tier #{i + 1}")
        if tier.id in seen:
            raise CatalogError(f"{where}: tier id '{tier.id}' appears twice.")
        seen.add(tier.id)
        tiers.append(tier)
    return Catalog(tuple(tiers), tuple(common))


# --------------------------------------------------------------------------- parsing


class _Fields:
    """Typed access to one JSON object, with errors naming the tier and field."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def fail(self, name: str, what: str) -> CatalogError:
        return CatalogError(f"{self.where}, field '{name}': {what}.")

    def has(self, name: str) -> bool:
        return name in self.data

    def _get(self, name: str, default: Any) -> Any:
        if name in self.data:
            return self.data[name]
        if default is _REQUIRED:
            raise self.fail(name, "missing")
        return default

    def str_(self, name: str, default: Any = None) -> str:
        v = self._get(name, _REQUIRED if default is None else default)
        if not isinstance(v, str):
            raise self.fail(name, f"expected a string, got {type(v).__name__}")
        return v

    def nonempty(self, name: str) -> str:
        v = self.str_(name)
        if not v.strip():
            raise self.fail(name, "must not be empty")
        return v

    def int_(self, name: str, default: Any = None, minimum: int = 0) -> int:
        v = self._get(name, _REQUIRED if default is None else default)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(name, f"expected an integer, got {type(v).__name__}")
        if v < minimum:
            raise self.fail(name, f"must be at least {minimum}, got {v}")
        return v

    def float_(self, name: str) -> float:
        v = self._get(name, _REQUIRED)
        if not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
            raise self.fail(name, f"expected a non-negative number, got {v!r}")
        return float(v)

    def bool_(self, name: str, default: Any = None) -> bool:
        v = self._get(name, _REQUIRED if default is None else default)
        if not isinstance(v, bool):
            raise self.fail(name, f"expected true or false, got {v!r}")
        return v

    def opt_bool(self, name: str) -> bool | None:
        v = self._get(name, _REQUIRED)
        if v is not None and not isinstance(v, bool):
            raise self.fail(name, f"expected true, false or null, got {v!r}")
        return v

    def strs(self, name: str, default: Any = None) -> tuple[str, ...]:
        v = self._get(name, _REQUIRED if default is None else default)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.fail(name, "expected a list of strings")
        return tuple(v)

    def objs(self, name: str) -> list[Mapping[str, Any]]:
        v = self._get(name, [])
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            raise self.fail(name, "expected a list of objects")
        return v


_REQUIRED = object()


def _check_keys(data: Mapping[str, Any], cls: type, where: str) -> None:
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise CatalogError(
            f"{where}: unknown field(s) {', '.join(repr(u) for u in unknown)}.",
            "Allowed: " + ", ".join(sorted(allowed)) + ".",
        )


def _sub(f: _Fields, name: str, cls: type, parse: Callable[[_Fields], Any]) -> tuple[Any, ...]:
    out = []
    for j, item in enumerate(f.objs(name)):
        w = f"{f.where}, {name}[{j}]"
        _check_keys(item, cls, w)
        out.append(parse(_Fields(item, w)))
    return tuple(out)


def _parse_quality(f: _Fields) -> QualityFigure:
    scope = f.str_("scope", "end-to-end")
    if scope not in ("end-to-end", "weight-space"):
        raise f.fail("scope", f"expected 'end-to-end' or 'weight-space', got {scope!r}")
    return QualityFigure(
        f.nonempty("metric"),
        f.nonempty("value"),
        f.str_("conditions"),
        "weight-space" if scope == "weight-space" else "end-to-end",
    )


def _parse_speed(f: _Fields) -> SpeedReport:
    kind = f.str_("kind")
    if kind not in ("decode", "prefill"):
        raise f.fail("kind", f"expected 'decode' or 'prefill', got {kind!r}")
    return SpeedReport(
        tokens_per_s=f.float_("tokens_per_s"),
        kind="decode" if kind == "decode" else "prefill",
        hardware=f.nonempty("hardware"),
        engine=f.nonempty("engine"),
        conditions=f.str_("conditions", ""),
        verified=f.bool_("verified", False),
        subject=f.str_("subject", ""),
    )


def _parse_override(f: _Fields) -> TensorOverride:
    pattern = f.nonempty("pattern")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise f.fail("pattern", f"not a valid regular expression ({exc})") from None
    t = f.str_("type")
    if t not in _GGML_TYPES:
        raise f.fail("type", f"unknown ggml type {t!r}")
    return TensorOverride(pattern, t, f.str_("note", ""))


def _parse_tier(item: object, where: str) -> Tier:
    if not isinstance(item, dict):
        raise CatalogError(f"{where}: expected an object.")
    tid = item.get("id")
    if isinstance(tid, str) and tid:
        where = f"{where.rsplit(':', 1)[0]}: tier '{tid}'"
    _check_keys(item, Tier, where)
    f = _Fields(item, where)

    tensor_types = _tensor_types(f, item.get("tensor_types"))
    vision, engines, include, derived = _choices(f, item)

    tier = Tier(
        id=f.nonempty("id"),
        publisher=f.nonempty("publisher"),
        name=f.nonempty("name"),
        repo=f.nonempty("repo"),
        include=include,
        first_shard=f.nonempty("first_shard"),
        shard_count=f.int_("shard_count", minimum=1),
        size_bytes=f.int_("size_bytes", minimum=1),
        size_text=f.nonempty("size_text"),
        experts_kept=f.int_("experts_kept", minimum=1),
        expert_quant=f.str_("expert_quant"),
        dense_quant=f.str_("dense_quant"),
        imatrix=f.opt_bool("imatrix"),
        tensor_types=tensor_types,
        mmproj=f.strs("mmproj"),
        vision="fork" if vision == "fork" else "upstream" if vision == "upstream" else "none",
        vision_note=f.str_("vision_note"),
        engines=tuple(_engine(e) for e in engines),
        extra_files=f.strs("extra_files", []),
        manifest=f.str_("manifest", ""),
        quality=_sub(f, "quality", QualityFigure, _parse_quality),
        quality_caveat=f.str_("quality_caveat", ""),
        speeds=_sub(f, "speeds", SpeedReport, _parse_speed),
        caveats=f.strs("caveats", []),
        extra_args=f.strs("extra_args", []),
        card_errata=f.strs("card_errata", []),
        reference=f.bool_("reference", False),
        known=f.bool_("known", True),
        tags=f.strs("tags", []),
        source=f.str_("source", ""),
        size_exact=f.bool_("size_exact", True),
        derived=derived,
        expert_feed_forward_length=f.int_("expert_feed_forward_length", 3072, minimum=1),
        tensor_overrides=_sub(f, "tensor_overrides", TensorOverride, _parse_override),
        tensor_types_note=f.str_("tensor_types_note", ""),
        vision_engine=f.str_("vision_engine", ""),
        mmproj_type=f.str_("mmproj_type", ""),
    )
    _check_tier(tier, f)
    return tier


def _tensor_types(f: _Fields, tensor_types: object) -> dict[str, str]:
    """The ``tensor_types`` object: a known ggml type for every role, no other role."""
    if not isinstance(tensor_types, dict):
        raise f.fail("tensor_types", "missing or not an object of role -> ggml type")
    missing_roles = [r for r in ROLES if r not in tensor_types]
    if missing_roles:
        raise f.fail("tensor_types", "no type for role(s) " + ", ".join(missing_roles))
    for role, t in tensor_types.items():
        if role not in ROLES:
            raise f.fail("tensor_types", f"unknown role {role!r} (roles: {', '.join(ROLES)})")
        if t not in _GGML_TYPES:
            raise f.fail("tensor_types", f"unknown ggml type {t!r} for role {role!r}")
    return {str(k): str(v) for k, v in tensor_types.items()}


def _choices(
    f: _Fields, item: dict[str, Any]
) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(vision, engines, include, derived), each checked against what k3desk knows, and
    the quant names."""
    vision = f.str_("vision")
    if vision not in get_args(VisionSupport):
        raise f.fail("vision", f"expected one of {', '.join(get_args(VisionSupport))}")
    engines = f.strs("engines")
    for e in engines:
        if e not in get_args(Engine):
            raise f.fail("engines", f"unknown engine {e!r}")
    if not engines:
        raise f.fail("engines", "must name at least one engine")
    include = f.strs("include")
    if not include:
        raise f.fail("include", "must have at least one pattern")
    for name in ("expert_quant", "dense_quant"):
        if f.str_(name) not in _GGML_TYPES:
            raise f.fail(name, f"unknown ggml type {item[name]!r}")
    derived = f.strs("derived", [])
    for d in derived:
        if d not in {x.name for x in dataclasses.fields(Tier)}:
            raise f.fail("derived", f"names no field: {d!r}")
    return vision, engines, include, derived


def _check_tier(tier: Tier, f: _Fields) -> None:
    """What holds between a tier's fields."""
    _check_shard_naming(tier, f)
    if tier.vision == "fork" and not tier.vision_engine:
        raise f.fail("vision_engine", "a tier whose vision needs a fork names that fork")
    if tier.vision_engine and tier.vision_engine not in KNOWN_FORKS:
        raise f.fail(
            "vision_engine",
            f"{tier.vision_engine!r} is not a fork k3desk can build "
            f"(known forks: {', '.join(KNOWN_FORKS)})",
        )
    if tier.experts_kept > 896:
        raise f.fail("experts_kept", f"Kimi-K3 has 896 routed experts, not {tier.experts_kept}")
    if tier.manifest and tier.manifest not in tier.extra_files:
        raise f.fail("manifest", "must also be listed in extra_files so it gets downloaded")


def _engine(e: str) -> Engine:
    if e == "sparkinfer":
        return "sparkinfer"
    if e == "vllm":
        return "vllm"
    return "llama.cpp"


def _check_shard_naming(tier: Tier, f: _Fields) -> None:
    split = parse_split_name(tier.first_shard)
    if tier.shard_count > 1:
        if split is None or split.number != 1:
            raise f.fail(
                "first_shard",
                f"{tier.first_shard!r} is not named like part 1 of a split set "
                "('<name>-00001-of-NNNNN.gguf')",
            )
        if split.count != tier.shard_count:
            raise f.fail(
                "shard_count",
                f"{tier.shard_count} disagrees with first_shard {tier.first_shard!r}",
            )
    elif not tier.first_shard.endswith(".gguf"):
        raise f.fail("first_shard", f"{tier.first_shard!r} is not a .gguf file")
    if not tier.matches(tier.first_shard):
        raise f.fail(
            "include",
            f"the patterns {list(tier.include)} do not select first_shard {tier.first_shard!r}",
        )
    stray = [n for n in tier.shard_names() if not tier.matches(n)]
    if stray:
        raise f.fail("include", f"the patterns do not select shard {stray[0]!r}")


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v
