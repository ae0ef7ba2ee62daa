"""k3desk's verdict on every variant of the mutation corpus is llama.cpp's own.

llama.cpp loads a variant (``llama-completion -m ... -n 1``) or refuses it; k3desk
must pass exactly the ones it loads (no false refusal) and refuse or flag as
suspicious the ones it refuses.  The table is printed at the end of the run.
"""

from __future__ import annotations

from collections import Counter

from k3desk.core.gguf.ggml import BY_ID
from tests.oracle.construct import LOADER_KEYS, PRE_TOKENIZERS, ROLE_TENSORS, TOKENIZER_MODELS
from tests.oracle.corpus import CATEGORIES, Result, disagreements, variants
from tests.oracle.llama import OracleSets


def test_every_variant_gets_the_verdict_llama_cpp_gives(corpus_results: list[Result]) -> None:
    assert len(corpus_results) >= 200
    false_refusals = [r for r in corpus_results if r.false_refusal]
    assert false_refusals == [], disagreements(false_refusals)
    assert disagreements(corpus_results) == ""


def test_the_corpus_has_every_kind_of_variant_and_both_verdicts(
    corpus_results: list[Result],
) -> None:
    by_cat = Counter(r.variant.category for r in corpus_results)
    assert set(by_cat) == set(CATEGORIES)
    loads = Counter(r.variant.category for r in corpus_results if r.llama.loads)
    refuses = Counter(r.variant.category for r in corpus_results if not r.llama.loads)
    # the categories where llama.cpp both loads and refuses some variants are the
    # ones that tell a rule from a guess
    both = {c for c in CATEGORIES if loads[c] and refuses[c]}
    assert {
        "optional tensors dropped",
        "alternative and extra tensors",
        "dtypes changed",
        "keys removed",
        "keys retyped",
        "split sets damaged",
        "experts pruned",
    } <= both
    assert loads["written by llama.cpp's tools"] == by_cat["written by llama.cpp's tools"] == 12
    assert refuses["required tensors dropped"] == by_cat["required tensors dropped"]


def test_suspicious_is_kept_for_whole_files_the_reference_loader_refuses(
    corpus_results: list[Result],
) -> None:
    """Broken files are refused outright; only loader-specific findings are suspicious."""
    kinds = {r.variant.name: r.k3desk for r in corpus_results}
    assert kinds["part 2 missing"] == "refused"
    assert kinds["part 2 cut inside its tensor data"] == "refused"
    assert kinds["expert_count lowered, tensors kept"] == "refused"
    assert kinds["unknown tensor blk.0.foo.weight added"] == "suspicious"
    assert kinds["blk.0.attn_q with type id 99 (unknown)"] == "suspicious"
    assert kinds["output.weight dropped"] == "suspicious"
    assert kinds["every conv stored 4-D (as converters write them)"] == "ok"


def test_the_full_corpus_covers_every_key_type_and_name_the_source_enumerates(
    oracle_sets: OracleSets,
) -> None:
    """The constructed corpus (run whole by ``python -m tests.oracle.corpus --full``)
    holds a variant for every key the loader reads, every ggml type on every tensor
    role, every tokenizer name llama-vocab.cpp knows, and the sample keeps each kind."""
    full = variants(oracle_sets, full=True)
    sample = variants(oracle_sets, full=False)
    assert len(full) >= 1000
    assert len(sample) < len(full) // 3
    names = {v.name for v in full}
    for key, _ in LOADER_KEYS:
        assert any(n.startswith(key + " ") for n in names), key
    for role in ROLE_TENSORS:  # every type but the one it has
        typed = [t for t in BY_ID.values() if f"{role} as {t.name}" in names]
        assert len(typed) >= len(BY_ID) - 1, role
    for model in TOKENIZER_MODELS:
        assert f"tokenizer.ggml.model '{model}'" in names
    for pre in PRE_TOKENIZERS:
        assert f"tokenizer.ggml.pre '{pre}'" in names
    assert {v.category for v in sample} == set(CATEGORIES)
    found = [v for v in full if v.category == "found by an independent corpus"]
    assert len(found) == 22
    assert all(v.sampled for v in found)
