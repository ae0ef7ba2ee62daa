"""Use-case "find the model in a folder": the GGUF shard sets a folder holds, each with its
vision projector.

Part 1 of a set is recognised by llama.cpp's split naming (``<prefix>-00001-of-NNNNN.gguf``,
:func:`k3desk.core.gguf.shards.discover`); an unsplit ``.gguf`` is a set of one.  A
projector (``mmproj`` in its name) is paired with the set in its own folder, else with
the first one found.  Only names are read here: the shells check a set's headers
before they use it (:mod:`k3desk.core.app.launch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k3desk.core.gguf.shards import discover


@dataclass(frozen=True)
class FoundModel:
    shard: Path  # part 1, the file llama-server is given
    projector: Path | None  # the vision projector beside it, if any
    name: str  # the set's name: part 1's file name without the split suffix
    parts: int  # how many parts the name says the set has


def is_projector(path: Path) -> bool:
    return "mmproj" in path.name.lower()


def find_models(folder: Path) -> list[FoundModel]:
    """Every shard set under ``folder`` (searched recursively), in path order."""
    if not folder.is_dir():
        return []
    ggufs = sorted(p for p in folder.rglob("*.gguf") if p.is_file())
    projectors = [g for g in ggufs if is_projector(g)]
    out = []
    for g in ggufs:
        if is_projector(g):
            continue
        parts = discover(g)
        if parts.given_index != 0:
            continue  # a later part (or a "00000-of" name llama.cpp cannot load)
        beside = next((p for p in projectors if p.parent == g.parent), None)
        projector = beside or (projectors[0] if projectors else None)
        out.append(FoundModel(g, projector, parts.prefix, parts.count))
    return out


def find_model(folder: Path) -> FoundModel | None:
    """The first shard set under ``folder``, with its projector, or None."""
    found = find_models(folder)
    return found[0] if found else None


def model_name(shard: Path) -> str:
    """The name a shard set goes by: part 1's file name without the split suffix."""
    return discover(shard).prefix


def projector_beside(shard: Path) -> Path | None:
    """The vision projector (mmproj) in the same folder as ``shard``, if there is one
    (only that folder is looked at: a shard may sit in a large one)."""
    try:
        beside = sorted(p for p in shard.parent.glob("*.gguf") if p.is_file())
    except OSError:
        return None
    return next((p for p in beside if is_projector(p)), None)
