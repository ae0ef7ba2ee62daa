"""Which catalog tier a shard set is, from what its headers say (not from its file name).

A set someone already has may be renamed, copied under another folder or written by
their own ``llama-gguf-split`` run; its file name proves nothing.  A tier is recognised
by facts the headers carry and the card publishes:

* the part count (``split.count``; the card's shard count, unless the card lists no
  files and the count is derived),
* the routed experts kept (``kimi-k3.expert_count``: 896, or 832 in the pruned tier),
* the routed experts' FFN width (``kimi-k3.expert_feed_forward_length``),
* the routed experts' tensor types (``ffn_*_exps``; the card's expert quantization,
  with its per-tensor overrides),
* the bytes of the parts, against the card's published total.

Every fact must agree.  The file name only breaks a tie between tiers that agree on all
of them (the same files published twice).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from k3desk.core.catalog.model import Tier
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.k3arch import is_expert_tensor
from k3desk.core.units import fmt_bytes

# The parts' bytes against the card's total: exact totals are byte counts of the same
# files (a set re-split by llama-gguf-split differs by its headers only); rounded ones
# ("539.7 GiB") are off by their rounding.
EXACT_SIZE_TOLERANCE = 0.001
ROUNDED_SIZE_TOLERANCE = 0.02
# Share of routed-expert tensors that must have the tier's type (the rest: a card's
# overrides we could only guess)
EXPERT_TYPE_SHARE = 0.9


@dataclass(frozen=True)
class TierMatch:
    tier: Tier
    facts: tuple[str, ...]  # the facts that agree, in words

    def text(self) -> str:
        """'9 parts, 896 experts of width 1536 in IQ1_S, 307.5 GiB'."""
        return ", ".join(self.facts)


def _expert_share(layout: ModelLayout, tier: Tier) -> tuple[float, str]:
    """The share of routed-expert tensors stored in the tier's type, and the main type."""
    experts = [t for t in layout.tensors if is_expert_tensor(t.name)]
    if not experts:
        return 0.0, ""
    same = sum(1 for t in experts if t.type_name == tier.type_for(t.name, "experts"))
    counts: dict[str, int] = {}
    for t in experts:
        counts[t.type_name] = counts.get(t.type_name, 0) + 1
    main = max(counts, key=lambda k: counts[k])
    return same / len(experts), main


def match_tier(layout: ModelLayout, tier: Tier) -> TierMatch | None:
    """``tier`` if every header fact of ``layout`` agrees with its card, else None."""
    hp = layout.hparams
    if layout.architecture != "kimi-k3":
        return None
    # a card that lists no files has its part count derived: it proves nothing then
    if len(layout.parts) != tier.shard_count and "shard_count" not in tier.derived:
        return None
    if hp.expert_count != tier.experts_kept:
        return None
    if hp.expert_feed_forward_length != tier.expert_feed_forward_length:
        return None
    total = sum(layout.part_sizes)
    tolerance = EXACT_SIZE_TOLERANCE if tier.size_exact else ROUNDED_SIZE_TOLERANCE
    if tier.size_bytes <= 0 or abs(total - tier.size_bytes) > tolerance * tier.size_bytes:
        return None
    share, main = _expert_share(layout, tier)
    if share < EXPERT_TYPE_SHARE:
        return None
    parts = f"{tier.shard_count} part{'s' if tier.shard_count != 1 else ''}"
    return TierMatch(
        tier,
        (
            parts,
            f"{hp.expert_count} experts of width {hp.expert_feed_forward_length} in {main}",
            fmt_bytes(total),
        ),
    )


def identify_tier(layout: ModelLayout, tiers: Iterable[Tier]) -> TierMatch | None:
    """The catalog tier ``layout`` is, by its header facts (see the module docstring)."""
    matches = [m for m in (match_tier(layout, t) for t in tiers) if m is not None]
    if not matches:
        return None
    name = layout.first_part.name
    return next((m for m in matches if m.tier.first_shard.rsplit("/", 1)[-1] == name), matches[0])
