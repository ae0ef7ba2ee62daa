"""Kimi-K3's multi-turn answers do not depend on the prompt cache.

Public Kimi-K3 reports say multi-turn chats came out corrupted when llama-server reused
part of its prompt cache (``--cache-reuse N``: chunks of the cached prompt shifted to
their new place after the prompt changed mid-way), with ``--cache-reuse 0`` as the
workaround.  k3desk passes no ``--cache-reuse``: llama.cpp's default is 0
(``common/common.h``: ``n_cache_reuse = 0``), and a person may add it among the extra
arguments.

Kimi-K3 is a hybrid model (KDA linear-attention layers keep a recurrent state beside the
MLA layers).  llama-server b11434 lets chunk reuse run on it (``llama_memory_hybrid::
get_can_shift`` asks only the attention part), but when the prompt parts from the cached
one before its end, the recurrent state of the shorter prefix is gone unless a context
checkpoint holds it, and the slot then starts over ("forcing full prompt re-processing due
to lack of cache data", ``tools/server/server-context.cpp``).  Not covered here: a
checkpoint lying inside the shifted chunks (checkpoints are 8192 tokens apart by default),
whose recurrent state would be the old prompt's; k3desk's default (no reuse) never gets
there.

The guard: a 3-turn conversation whose system prompt changes each turn (the time stamp
many tools put there, which makes the prompt part mid-way, the case chunk reuse is for),
after a document long enough for a 256-token chunk, answered greedily with a fixed seed by
the tiny Kimi-K3, gives the same answers turn by turn with ``--cache-reuse 256``, with
``--cache-reuse 16``, with llama-server's default, with ``--cache-reuse 0`` and with
``cache_prompt: false`` on every request; with reuse asked for, the later turns take
nothing from the cache (``timings.cache_n`` is 0: the prompt was processed again).  An
engine that starts reusing K3's cache and gets it wrong fails the first part; one that
starts reusing it at all fails the second: then look again (and pass ``--cache-reuse 0``
in k3desk/core/planning/argv.py if the answers differ).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from k3desk.core.engines.launch import prepare_launch
from k3desk.core.engines.supervisor import Endpoint, Supervisor
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths
from k3desk.core.planning.model import PlanOptions
from k3desk.devtools.tinyk3 import TinyModel

pytestmark = [pytest.mark.engine, pytest.mark.slow]

DOC = " ".join(f"Line {i}: the river bends east past the mill, then north." for i in range(16))
TURNS = ("Summarize this:\n" + DOC, "Shorter, please.", "Which line names the mill first?")

Serve = Callable[[tuple[str, ...]], Endpoint]


@pytest.fixture
def serve(llama_server: Path, tiny_k3_single: TinyModel, hardware_file: object) -> Iterator[Serve]:
    hw = HardwareProfile.from_json_file(hardware_file("no-gpu-laptop-32GB"))  # type: ignore[operator]
    running: list[Supervisor] = []

    def start(extra: tuple[str, ...]) -> Endpoint:
        prepared = prepare_launch(
            tiny_k3_single.first_part,
            mmproj=None,
            hardware=hw,
            options=PlanOptions(ctx=2048, extra_args=extra),
            paths=default_paths(),
            engine=llama_server,
        )
        sup = Supervisor(prepared.spec(), default_paths())
        running.append(sup)
        sup.start()
        return sup.wait_ready(90)

    try:
        yield start
    finally:
        for sup in running:
            sup.stop()


def conversation(ep: Endpoint, *, cache_prompt: bool = True) -> tuple[list[str], list[int]]:
    """The answers to :data:`TURNS`, each turn sent with the answers so far, greedy; and
    how many prompt tokens of each turn came from the cache (llama-server's
    ``timings.cache_n``)."""
    messages: list[dict[str, str]] = []
    answers = []
    cached = []
    for n, turn in enumerate(TURNS):
        messages.append({"role": "user", "content": turn})
        stamp = {"role": "system", "content": f"You help. It is 18:{7 * n:02d}{'.' * n}"}
        body = {
            "messages": [stamp, *messages],
            "max_tokens": 16,
            "seed": 7,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": cache_prompt,
            "chat_template_kwargs": {"thinking": False},
        }
        r = httpx.post(f"{ep.url}/v1/chat/completions", json=body, headers=ep.headers, timeout=120)
        assert r.status_code == 200, r.text
        answer = r.json()["choices"][0]["message"].get("content") or ""
        answers.append(answer)
        cached.append(int(r.json()["timings"]["cache_n"]))
        messages.append({"role": "assistant", "content": answer})
    return answers, cached


def test_multi_turn_answers_are_the_same_with_cache_reuse_on_and_off(serve: Serve) -> None:
    runs: dict[str, list[str]] = {}
    cached: dict[str, list[int]] = {}
    for name, extra in (
        ("--cache-reuse 256", ("--cache-reuse", "256")),
        ("--cache-reuse 16", ("--cache-reuse", "16")),
        ("default", ()),
        ("--cache-reuse 0", ("--cache-reuse", "0")),
    ):
        ep = serve(extra)
        runs[name], cached[name] = conversation(ep)
        if name == "--cache-reuse 0":
            runs["cache_prompt false"], _ = conversation(ep, cache_prompt=False)
    reference = runs["cache_prompt false"]
    assert all(reference), "the model said nothing"
    for name, answers in runs.items():
        for turn, (got, want) in enumerate(zip(answers, reference, strict=True), 1):
            assert got == want, f"turn {turn} differs with {name}: {got!r} != {want!r}"
    # reuse asked for, the later turns still took nothing from the cache: the engine
    # processed each prompt again rather than shift the chunks after the time stamp
    assert cached["--cache-reuse 256"][1:] == [0, 0]
    assert cached["--cache-reuse 16"][1:] == [0, 0]
