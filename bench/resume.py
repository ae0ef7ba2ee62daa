"""A long conversation continued after a restart: from its kept engine state vs read again.

    python bench/resume.py [--tokens 4000] [--rounds 5] [--wide]        # the tiny K3
    python bench/resume.py --twin vcruz305-ud-iq1s --tokens 600 --rounds 1

What a person waits for when they come back to a conversation: the time from sending the
next question, on an engine just started, to the first token of its answer.

1. **reread**: a fresh engine (the real llama-server, one slot, ``--slot-save-path``:
   what k3desk runs) is sent a conversation of ``--tokens`` tokens with its next
   question; the clock runs from the request to the first token.  Then k3desk keeps the
   conversation's state (:class:`k3desk.core.chat.kept_state.StateKeeper`, as the chat
   window does after every answer) and the engine stops.
2. **resume**: a fresh engine; k3desk checks the kept state and restores it, then the same
   question is streamed; the clock runs from before the checks to the first token.

3. **no restart**: on the engine of 2, the same question again, the conversation still in
   its slot: a request with nothing to restore or read, the floor for any resume.
4. **the engine alone**: a fresh engine is told over plain HTTP (httpx, none of k3desk's
   code) to restore the same state file and is sent the same request body: what the
   engine itself needs to resume, with no check by anyone.  ``resume/engine alone`` is
   what k3desk's checks add; ``engine alone/reread`` is the least any client of this
   engine can reach.  Once more with a short request sent before the clock starts, so
   that a fresh engine's first-request cost is not counted.

1 and 2 (with 3 and 4) alternate for ``--rounds`` rounds; the medians are compared.
Greedy, seed fixed, thinking off: all must give the same first tokens, and the engine's
own timings must say the resumed run read only the question (``cache_n`` = the state's
tokens).

``--twin TIER`` runs the same on a sparse twin of a real tier (the 9-part UD-IQ1_S,
329 GB apparent) with the arguments k3desk's plan gives on this machine.  On a machine
without the RAM for it every token is slow (measured here on 2 cores: 1.34 s a token in a
long read, 2.7-6.6 s in a short one), so the conversation is shorter and one round is run.

Goals (the last line prints ``resume/reread = X``): <= 0.05 on the tiny K3 with 4,000
tokens, <= 0.02 on the twin.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from k3desk.core.chat.client import ChatClient, ChatEndpoint, ChatMessage
from k3desk.core.chat.kept_state import StateKeeper, prompt_tokens
from k3desk.core.chat.model import ChatSettings
from k3desk.core.engines.discovery import find_llama_server
from k3desk.core.engines.supervisor import LaunchSpec, Supervisor
from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import write_tiny_k3

GOAL = {"tiny": 0.05, "twin": 0.02}
QUESTION = "Go on."
STORY = (
    "the river carried old boats past the mill while the miller counted sacks of grain "
    "and his daughter wrote letters to a sailor far away on a ship bound for the islands"
)


def conversation(client: ChatClient, tokens: int, settings: ChatSettings) -> list[ChatMessage]:
    """Turns of plain text whose prompt, with the question, is ``tokens`` long or just under
    (the last question and answer cut to fit)."""

    def size(talk: list[ChatMessage]) -> int:
        return prompt_tokens(client, [*talk, ChatMessage("user", QUESTION)], settings) or 0

    words = STORY.split()
    talk: list[ChatMessage] = []
    i = 0
    while size(talk) < tokens:
        for role in ("user", "assistant"):
            text = " ".join(words[(i + k) % len(words)] for k in range(60))
            talk.append(ChatMessage(role, text.capitalize() + "."))
            i += 7
    asked, said = talk[-2].content.split(), talk[-1].content.split()

    def cut(n: int) -> list[ChatMessage]:
        """The last turn with ``n`` of its words: the question's first, then the answer's."""
        q = " ".join(asked[: max(1, min(n, len(asked)))])
        a = " ".join(said[: max(1, n - len(asked))])
        return [*talk[:-2], ChatMessage("user", q), ChatMessage("assistant", a)]

    lo, hi = 1, len(asked) + len(said)  # the most words of the last turn that fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size(cut(mid)) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return cut(lo) if size(cut(lo)) <= tokens else talk[:-2]


@contextmanager
def engine(spec: LaunchSpec) -> Iterator[ChatClient]:
    with Supervisor(spec, default_paths()) as sup:
        sup.start()
        ep = sup.wait_ready(3600)
        with ChatClient(ChatEndpoint(ep.url, ep.api_key, owner_pid=ep.pid)) as client:
            yield client
        sup.stop()


def first_token(client: ChatClient, messages: list[ChatMessage], settings: ChatSettings,
                t0: float) -> tuple[float, str, int]:  # fmt: skip
    """Seconds from ``t0`` to the first delta, the answer, and the engine's cache_n."""
    first = 0.0
    with client.stream(messages, settings) as st:
        for _ in st:
            first = first or time.monotonic() - t0
        result = st.result
    first = first or time.monotonic() - t0  # one token may come as no visible text
    assert result is not None
    return first, result.text + result.reasoning, result.timings.cache_n if result.timings else 0


def engine_alone(spec: LaunchSpec, state: str, tokens: int, body: dict[str, object],
                 warm: bool = False) -> tuple[float, str]:  # fmt: skip
    """A fresh engine (started as k3desk starts it), then driven over plain HTTP: restore
    ``state`` (``tokens`` long) into slot 0 and stream ``body``; seconds from the
    restore's request to the first piece of text, and the answer.  ``warm``: a short
    request first, so that the engine's first-request cost is paid before the clock."""
    with Supervisor(spec, default_paths()) as sup:
        sup.start()
        ep = sup.wait_ready(3600)
        auth = {"Authorization": f"Bearer {ep.api_key}"}
        with httpx.Client(base_url=ep.url, headers=auth, timeout=None) as http:
            if warm:
                http.post("/completion", json={"prompt": "Hello there, how", "n_predict": 1,
                                               "id_slot": 0}).raise_for_status()  # fmt: skip
            t0 = time.monotonic()
            got = http.post("/slots/0?action=restore", json={"filename": state}).json()
            if got.get("n_restored") != tokens:
                raise SystemExit(f"the engine alone restored {got!r}, not {tokens} tokens")
            first, text = 0.0, []
            with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                for line in resp.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    for choice in json.loads(line[6:]).get("choices") or []:
                        delta = choice.get("delta") or {}
                        piece = (delta.get("content") or "") + (
                            delta.get("reasoning_content") or ""
                        )
                        if piece:
                            first = first or time.monotonic() - t0
                            text.append(piece)
            first = first or time.monotonic() - t0  # one token may come as no visible text
        sup.stop()
    return first, "".join(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--twin", metavar="TIER", help="a real tier's sparse twin (e.g. vcruz305-ud-iq1s)"
    )
    ap.add_argument("--wide", action="store_true", help="the wide tiny K3 (slower to read)")
    ap.add_argument("--dir", type=Path, help="where to write the model (default: a temp dir)")
    a = ap.parse_args()
    exe = find_llama_server(default_paths())
    if exe is None:
        raise SystemExit("no llama-server found (scripts/setup.sh --test installs one)")
    settings = ChatSettings(thinking=False, max_tokens=1 if a.twin else 4, seed=1,
                            temperature=0.0)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="k3-resume-") as tmp:
        os.environ.setdefault("K3DESK_HOME", str(Path(tmp) / "home"))
        where = a.dir or Path(tmp) / "model"
        folder = Path(tmp) / "states"
        ctx = str(max(2048, a.tokens + 96))
        if a.twin:
            spec, what = twin_spec(exe, a.twin, where, ctx)
        else:
            model = write_tiny_k3(where, wide=a.wide)
            spec = LaunchSpec(exe, ("-m", str(model.first_part), "-c", ctx, "-np", "1",
                                    "--jinja", "-t", "2"))  # fmt: skip
            what = "wide tiny K3" if a.wide else "tiny K3"
        spec = replace(spec, state_dir=folder, ready_timeout=3600.0)
        keeper = StateKeeper(folder, budget=1 << 40)
        resume: list[float] = []
        reread: list[float] = []
        floor: list[float] = []
        alone: list[float] = []
        warmed: list[float] = []
        for r in range(a.rounds):
            # reread: a fresh engine reads it all; then k3desk keeps its state, as after
            # any answer (the engine's own checkpoint at the question makes that cheap)
            with engine(spec) as client:
                if r == 0:
                    talk = conversation(client, a.tokens, settings)
                    asked = [*talk, ChatMessage("user", QUESTION)]
                    n = prompt_tokens(client, asked, settings)
                s, text_read, _ = first_token(client, asked, settings, time.monotonic())
                reread.append(s)
                kept = keeper.keep(client, "bench", talk, settings)
            if not kept.done:
                raise SystemExit(f"the state was not kept: {kept.why}")
            if r == 0:
                mib = kept.size / 2**20
                print(f"{what}: a conversation of {n:,} tokens with the question; its "
                      f"state {kept.tokens:,} tokens, {mib:.1f} MiB, kept in "
                      f"{kept.seconds:.1f} s", flush=True)  # fmt: skip
            # resume: a fresh engine, the kept state checked and restored, the question
            with engine(spec) as client:
                t0 = time.monotonic()
                back = keeper.bring_back(client, "bench", asked, settings)
                if not back.done:
                    raise SystemExit(f"the kept state was not restored: {back.why}")
                checked = time.monotonic() - t0
                s, text_resumed, cache_n = first_token(client, asked, settings, t0)
                # the floor: the same question again, its conversation still in the slot
                # (no restart at all): what any request costs on this engine
                again, _, _ = first_token(client, asked, settings, time.monotonic())
                body = client.build_body(asked, settings)
            floor.append(again)
            # the engine alone: the same state file (the round's keep: the newest) and body
            state = max(folder.glob("k3c-*.bin"), key=lambda f: f.stat().st_mtime).name
            bare, text_bare = engine_alone(spec, state, back.tokens, body)
            alone.append(bare)
            warmed.append(engine_alone(spec, state, back.tokens, body, warm=True)[0])
            if cache_n != back.tokens:
                raise SystemExit(f"the engine reused {cache_n} tokens, not {back.tokens}")
            if not text_read == text_resumed == text_bare:
                raise SystemExit(
                    f"different answers: {text_resumed!r} (resumed), "
                    f"{text_bare!r} (engine alone) vs {text_read!r}"
                )
            resume.append(s)
            print(f"round {r + 1}: reread {reread[-1]:.3f} s, resume {resume[-1]:.3f} s "
                  f"(checks and restore {checked:.3f} s, of which restore "
                  f"{back.seconds:.3f} s), engine alone {alone[-1]:.3f} s (warmed "
                  f"{warmed[-1]:.3f} s), no restart "
                  f"{floor[-1]:.3f} s, the same answer "
                  f"{text_read!r}", flush=True)  # fmt: skip
    ratio = statistics.median(resume) / statistics.median(reread)
    least = statistics.median(floor) / statistics.median(reread)
    goal = GOAL["twin" if a.twin else "tiny"]
    print(f"median first token after a restart: resume {statistics.median(resume):.3f} s, "
          f"reread {statistics.median(reread):.3f} s; goal <= {goal}")  # fmt: skip
    print(f"the same question with no restart at all (the conversation still in the slot): "
          f"{statistics.median(floor):.3f} s, {least:.4f} of the reread: "
          "no resume is faster")  # fmt: skip
    bare = statistics.median(alone)
    print(f"the engine alone, restoring the same state over plain HTTP and sent the same "
          f"request: {bare:.3f} s, {bare / statistics.median(reread):.4f} of the reread "
          f"(the least any client of this engine reaches); resume/engine alone = "
          f"{statistics.median(resume) / bare:.3f}")  # fmt: skip
    warm = statistics.median(warmed)
    print(f"the engine alone with a short request before the clock (its first-request cost "
          f"paid): {warm:.3f} s, {warm / statistics.median(reread):.4f} of the reread")  # fmt: skip
    print(f"resume/reread = {ratio:.4f}")
    return 0 if ratio <= goal else 1


def twin_spec(exe: Path, tier_id: str, where: Path, ctx: str) -> tuple[LaunchSpec, str]:
    """k3desk's launch of a sparse twin of ``tier_id`` on this machine, one slot."""
    from k3desk.core.app.launch import LocalLaunchRequest, prepare_local_launch
    from k3desk.core.app.services import Services
    from k3desk.core.catalog.loader import load_catalog
    from k3desk.core.resources import resources_dir
    from k3desk.devtools.twin import write_twin

    tier = load_catalog(resources_dir() / "catalog.json").get(tier_id)
    parts = sorted(p for p in where.glob("*.gguf") if "mmproj" not in p.name)
    if not parts:
        parts = [p for p in write_twin(tier, where) if "mmproj" not in p.name]
    launch = prepare_local_launch(
        Services(), LocalLaunchRequest(parts[0], engine=exe, accept_slow=True)
    )
    spec = launch.prepared.spec()
    args = list(spec.args)
    if "-c" in args:
        args[args.index("-c") + 1] = ctx
    size = sum(p.stat().st_size for p in parts)
    return replace(
        spec, args=tuple(args)
    ), f"{tier.name} twin ({len(parts)} parts, {size / 1e9:.0f} GB)"


if __name__ == "__main__":
    sys.exit(main())
