"""Which vision projector (``mmproj``) belongs to a shard set in a Hub repository.

A set is its files: the text shards and, where the repository has one for it, the
projector that lets the engine read images (llama-server ``--mmproj``).  How the
repositories lay them out (the cards in the catalog's sources):

* one projector at the repository's root that pairs with every quant in it
  (AtomicChat: ``mmproj-F16.gguf`` and ``mmproj-BF16.gguf``; 6block:
  ``Kimi-K3-mmproj-BF16.gguf``);
* a projector beside each quant, in the quant's folder.

The rule, in order: a catalog tier's own ``mmproj`` names (what its card says, the
same files a tier download brings); else the projectors in the set's folder; else
those at the root; else the repository's only projector.  Where several are left
(the same projector in several precisions) one is taken: F16 before BF16 before F32
before any other (every llama.cpp build reads F16; BF16 needs a build whose CPU
backend has it), then by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from k3desk.core.hub.listing import select
from k3desk.core.hub.model import RemoteFile

if TYPE_CHECKING:
    from k3desk.core.catalog.model import Tier

# the --include pattern that lists every projector of a repository (``*`` crosses ``/``)
PROJECTORS = "*mmproj*"
# preferred precisions, best first (a name part, matched case-insensitively)
PRECISIONS = ("f16", "bf16", "f32")


def is_projector(path: str) -> bool:
    """Whether ``path`` names a vision projector (``mmproj`` in its file name)."""
    name = path.rsplit("/", 1)[-1].lower()
    return "mmproj" in name and name.endswith(".gguf")


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def _rank(f: RemoteFile) -> tuple[int, str]:
    name = f.path.rsplit("/", 1)[-1].lower().removesuffix(".gguf")
    parts = name.replace("_", "-").replace(".", "-").split("-")
    for i, p in enumerate(PRECISIONS):
        if p in parts:
            return i, f.path
    return len(PRECISIONS), f.path


def projectors_for(
    first_part: str, projectors: Sequence[RemoteFile], tier: Tier | None = None
) -> tuple[RemoteFile, ...]:
    """The projector files that come with the set whose first part is ``first_part``,
    among the repository's ``projectors`` (see the module docstring); () when none."""
    if tier is not None and tier.mmproj:
        names = set(select([f.path for f in projectors], list(tier.mmproj)))
        return tuple(f for f in projectors if f.path in names)
    if tier is not None and tier.vision == "none":
        return ()  # its card says the set reads no images
    folder = _folder(first_part)
    beside = [f for f in projectors if _folder(f.path) == folder]
    root = [f for f in projectors if not _folder(f.path)]
    candidates = beside or root or (list(projectors) if len(projectors) == 1 else [])
    if not candidates:
        return ()
    return (min(candidates, key=_rank),)
