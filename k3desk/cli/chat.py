"""``k3desk chat``: one question to Kimi-K3, answered as it streams.

Either from a local GGUF (k3desk starts llama-server on it, asks, and stops it)
or from a running OpenAI-compatible server (``--url``).  The answer goes to
stdout as it arrives; the model's reasoning goes to stderr (dimmed on a
terminal), so ``k3desk chat ... > answer.txt`` keeps only the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from k3desk.cli import control
from k3desk.core.app.cells import no_text
from k3desk.core.app.chat import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    DIALECT_IDS,
    THINKING_EFFORTS,
    ChatClient,
    ChatDelta,
    ChatEndpoint,
    ChatMessage,
    ChatResult,
    ChatSettings,
    ImageError,
    Kept,
    PreparedImage,
    ignored_settings,
    keeper_for,
    load_image,
)
from k3desk.core.app.chat_turn import ConversationStates, TurnRecord, run_turn
from k3desk.core.app.values import (
    CancelToken,
    ChatError,
    EngineError,
    K3Error,
    has_undecodable,
    scrub,
    what_is,
)

if TYPE_CHECKING:
    from k3desk.core.app.engines import Event
    from k3desk.core.app.services import Services

API_KEY_ENV = "K3DESK_API_KEY"
# chat --save writes the streaming answer this often: a process killed mid-answer
# (kill -9, a crash) loses at most its last second
SAVE_EVERY_S = 1.0
DIM, RESET = "\x1b[2m", "\x1b[0m"


class _IntermixedParser(argparse.ArgumentParser):
    """Lets positionals and options mix (``SHARD --image F PROMPT``).

    Plain argparse stops filling a positional at the first option, so PROMPT
    after options would be rejected as unrecognised.
    """

    _inner = False

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._inner:
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "chat",
        help="ask Kimi-K3 one question (from a local GGUF or a running server)",
        usage="k3desk chat (SHARD | --url URL [--api-key KEY] [--server KIND]) [--mmproj FILE] "
        "[--image FILE]... [--no-thinking] [--stop TEXT]... [--json] PROMPT",
        description="Ask one question and stream the answer to stdout.  With SHARD (part 1 "
        "of a Kimi-K3 GGUF) k3desk starts llama-server, asks, and stops it; with --url it "
        "asks a running OpenAI-compatible server.  Reasoning is shown on stderr.  "
        "PROMPT '-' reads the prompt from stdin.",
    )
    # options may come between SHARD and PROMPT (as in the usage line)
    p.__class__ = _IntermixedParser
    p.add_argument("positional", nargs="+", metavar="[SHARD] PROMPT", help=argparse.SUPPRESS)
    _server_options(p)
    _sampling_options(p)
    _launch_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument("--save", action="store_true", help="keep the exchange in the chat history")
    p.add_argument(
        "--continue",
        dest="continue_id",
        type=int,
        metavar="ID",
        help="ask the next question of saved conversation ID (`--save` prints it); with "
        "SHARD the engine starts from the state kept for it, when it matches, instead of "
        "reading the conversation again",
    )
    p.set_defaults(handler=run)


def _server_options(p: argparse.ArgumentParser) -> None:
    """Where the question goes (a running server), and what it carries (images)."""
    p.add_argument("--url", help="a running OpenAI-compatible server (e.g. http://host:8080)")
    p.add_argument(
        "--api-key",
        help=f"the server's API key (default: ${API_KEY_ENV}); with SHARD k3desk makes one",
    )
    p.add_argument("--model", help="model name to request (remote servers that serve several)")
    p.add_argument(
        "--server",
        choices=("auto", *DIALECT_IDS),
        default="auto",
        metavar="KIND",
        help="what kind of server --url is: auto (k3desk finds out), " + ", ".join(DIALECT_IDS),
    )
    p.add_argument("--mmproj", type=Path, metavar="FILE", help="vision projector (with SHARD)")
    p.add_argument(
        "--image",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="attach an image (PNG, JPEG, GIF or WebP; repeatable)",
    )


def _sampling_options(p: argparse.ArgumentParser) -> None:
    """How the model answers."""
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("--no-thinking", action="store_true", help="answer without reasoning first")
    p.add_argument("--effort", choices=THINKING_EFFORTS, help="how much to think")
    p.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE, metavar="T")
    p.add_argument("--top-p", type=float, default=DEFAULT_TOP_P, metavar="P")
    p.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="stop after N generated tokens (default: as many as the server allows)",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="end the answer where TEXT would come (repeatable)",
    )
    p.add_argument("--seed", type=int, help="sampling seed (repeatable answers)")
    p.add_argument("--top-k", type=int, metavar="K", help="pick from the K likeliest tokens")
    p.add_argument("--min-p", type=float, metavar="P", help="drop tokens below P x the likeliest")
    p.add_argument(
        "--repeat-penalty", type=float, metavar="R", help="make repeats less likely (1.0: off)"
    )


def _launch_options(p: argparse.ArgumentParser) -> None:
    """How k3desk starts llama-server for a SHARD."""
    p.add_argument(
        "--ctx",
        type=int,
        metavar="N",
        help="context size (SHARD; default 8192, or the model's trained context if less)",
    )
    p.add_argument("--engine", type=Path, metavar="PATH", help="llama-server to use (SHARD)")
    p.add_argument(
        "--hardware",
        type=Path,
        metavar="FILE",
        help="plan the launch for this hardware file (`k3desk doctor --json`) (SHARD); "
        "kept only while that plan can run on this machine",
    )
    p.add_argument(
        "--accept-slow",
        action="store_true",
        help="launch even when the model does not fit in RAM and streams from disk "
        "(SHARD; the warning says the seconds per token and the load time)",
    )
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra llama-server argument (SHARD; repeatable, e.g. --engine-arg=--n-cpu-moe=60)",
    )


def _split_positional(args: argparse.Namespace) -> tuple[Path | None, str]:
    pos: list[str] = args.positional
    if args.url:
        if len(pos) != 1:
            raise K3Error(
                "With --url, give only the prompt (no model file).",
                'Example: k3desk chat --url http://127.0.0.1:8080 "Hello"',
            )
        shard, prompt = None, pos[0]
    else:
        if len(pos) != 2:
            raise K3Error(
                "Give the model's first GGUF part and the prompt, or --url and the prompt.",
                'Example: k3desk chat Kimi-K3-UD-IQ1_S-00001-of-00009.gguf "Hello"',
            )
        shard, prompt = Path(pos[0]), pos[1]
    if prompt == "-":
        prompt = _read_stdin()
    prompt = _text(prompt, "The prompt")
    if not prompt.strip() and not args.image:
        raise K3Error("The prompt is empty.", "Type a question, or pass '-' to read stdin.")
    return shard, prompt


def _read_stdin() -> str:
    """stdin as text, whatever its bytes (undecodable ones become lone surrogates and are
    replaced by :func:`_text`): the locale's strict decoder would end in a traceback."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:
        return sys.stdin.read()
    return bytes(buffer.read()).decode("utf-8", "surrogateescape")


def _text(value: str, what: str) -> str:
    """``value`` with undecodable bytes replaced by U+FFFD, saying so on stderr."""
    if not has_undecodable(value):
        return value
    print(
        f"note: {what} has bytes that are not UTF-8; each was replaced with U+FFFD (\ufffd).",
        file=sys.stderr,
    )
    return scrub(value)


def run(args: argparse.Namespace, services: Services) -> int:
    shard, prompt = _split_positional(args)
    system = _text(args.system, "The system prompt") if args.system else ""
    # check everything cheap before starting an engine that may take minutes to load
    _check_options(args, shard, system)
    settings = _chat_settings(args)
    images = tuple(load_image(p) for p in args.image)
    messages: list[ChatMessage] = []
    if system:
        messages.append(ChatMessage("system", system))
    messages.append(ChatMessage("user", prompt, images))

    cancel = CancelToken()
    with ExitStack() as stack:
        record = None
        if args.continue_id is not None:
            record = _continued(stack, services, args.continue_id, prompt, images)
            messages = record.request_messages()
        elif args.save:
            # the question is in the history before the engine starts: whatever happens
            # later (Ctrl-C, kill -9, a crash), the prompt is kept, and the answer as it streams
            model = shard.name if shard is not None else str(args.url)
            record = _record(stack, services, prompt, images, settings, system, model)
        key: str | None
        owner: int | None = None  # the engine k3desk started: the key goes to it alone
        planned_tps = 0.0
        if shard is not None:
            url, key, owner, planned_tps = _start_engine(stack, shard, args, services, cancel)
        else:
            url, key = str(args.url), args.api_key or os.environ.get(API_KEY_ENV) or None
        server = None if args.server == "auto" else args.server
        endpoint = ChatEndpoint(url, key, args.model, server, owner_pid=owner)
        client = stack.enter_context(ChatClient(endpoint))
        if shard is None:
            _describe_server(client, settings, quiet=args.json)
        states = None
        if owner is not None and record is not None:
            keep_gib = services.settings().kept_state_gib
            states = ConversationStates(keeper_for(services.paths.cache, keep_gib), planned_tps)
        result, error, state = _ask_keeping(
            client, messages, settings, cancel, args, record=record, states=states
        )
    if record is not None and not args.json:
        print(
            f"Saved as conversation {record.conversation.id} in {services.paths.history_db}.",
            file=sys.stderr,
        )
    if args.json:
        out = result.to_dict()
        if error is not None:
            out["error"] = error.message
        if record is not None:
            out["conversation"] = record.conversation.id
        if state:
            out["engine_state"] = state
        print(json.dumps(out, ensure_ascii=False))
    if error is not None:
        raise error
    return 0


def _check_options(args: argparse.Namespace, shard: Path | None, system: str) -> None:
    """What the options say that cannot work, before anything starts."""
    if shard is not None and args.server != "auto":
        raise K3Error(
            "--server applies to --url only: with a model file k3desk starts llama-server.",
        )
    if shard is None and (args.mmproj or args.engine or args.engine_arg or args.hardware):
        raise K3Error(
            "--mmproj, --engine, --engine-arg and --hardware apply only when k3desk starts "
            "the engine from a model file.",
            "The server at --url was started with its own settings.",
        )
    if shard is not None:
        _check_shard(shard)
        if args.mmproj is not None and not args.mmproj.is_file():
            raise EngineError(f"The vision projector {args.mmproj} does not exist.")
        if args.image and args.mmproj is None:
            from k3desk.core.app.hub_choice import projector_hint

            raise ImageError(
                "--image needs --mmproj FILE when k3desk starts the engine from a model file: "
                "without the vision projector the model cannot see images.",
                projector_hint(shard),
            )
    if args.continue_id is not None and system:
        raise K3Error(
            "--system applies to a new conversation: a continued one keeps its own.",
        )


def _chat_settings(args: argparse.Namespace) -> ChatSettings:
    return ChatSettings(
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
        top_k=args.top_k,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        thinking=not args.no_thinking,
        thinking_effort=args.effort,
        stop=tuple(args.stop),
    )


def _ask_keeping(
    client: ChatClient,
    messages: list[ChatMessage],
    settings: ChatSettings,
    cancel: CancelToken,
    args: argparse.Namespace,
    *,
    record: TurnRecord | None,
    states: ConversationStates | None,
) -> tuple[ChatResult, ChatError | None, dict[str, Any]]:
    """The turn, from the conversation's kept engine state where there is one, and its
    state kept after the answer (an engine k3desk started, a conversation in the history)."""
    state: dict[str, Any] = {}
    if states is not None and args.continue_id is not None:
        back = states.before(client, args.continue_id, messages, settings)
        if back is not None:
            state["restored"] = _state_facts(back)
            _say(back.said(), quiet=args.json)
    result, error = _ask(client, messages, settings, cancel, as_json=args.json, record=record)
    if states is not None and record is not None and error is None:
        kept = states.after(client, record, settings)
        if kept is not None:
            state["kept"] = _state_facts(kept)
            _say(kept.text("Kept this conversation's engine state"), quiet=args.json)
    return result, error, state


def _describe_server(client: ChatClient, settings: ChatSettings, *, quiet: bool) -> None:
    """Say what --url is, and which settings it will not honour (on stderr)."""
    try:
        info = client.server()
    except ChatError:
        return  # the request itself says what is wrong
    if quiet:
        return
    limits = info.limits_text()
    print(f"Server: {info.describe()}" + (f"; {limits}" if limits else "") + ".", file=sys.stderr)
    for note in ignored_settings(info, settings):
        print(f"  - {note}", file=sys.stderr)


def _check_shard(shard: Path) -> None:
    from k3desk.core.app.shards import discover

    what = what_is(shard)
    if what == "missing":
        raise EngineError(f"The model file {shard} does not exist.", "Check the path.")
    if what:
        raise EngineError(f"{shard} is {what}, not a model file.", "Pass the model's .gguf file.")
    parts = discover(shard)
    if parts.given_index != 0:
        raise EngineError(
            f"{shard.name} is part {parts.given_index + 1} of {parts.count}; llama-server "
            "must be given part 1.",
            f"Use {parts.paths[0]}.",
        )
    odd = parts.not_files()
    if odd:
        i, what = odd[0]
        raise EngineError(
            f"Part {parts.part_label(i)} of {parts.prefix} is {what}, not a file: "
            f"{parts.paths[i]}.",
            "Put the part itself there (a regular file), under its published name.",
        )
    missing = parts.missing()
    if missing:
        names = ", ".join(parts.part_name(i) for i in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise EngineError(
            f"The model {parts.prefix} is incomplete: {names}{more} missing in {parts.directory}.",
            "Finish the download (k3desk download) so every part is in the same folder.",
        )


def _start_engine(
    stack: ExitStack,
    shard: Path,
    args: argparse.Namespace,
    services: Services,
    cancel: CancelToken,
) -> tuple[str, str, int, float]:
    from k3desk.core.app.engines import State, Supervisor
    from k3desk.core.app.launch import LocalLaunchRequest, prepare_local_launch, slow_warning

    quiet = args.json
    launch = prepare_local_launch(
        services,
        LocalLaunchRequest(
            shard,
            mmproj=args.mmproj,
            ctx=args.ctx,
            extra_args=tuple(args.engine_arg),
            engine=args.engine,
            configured_engine=services.configured_engine(),
            hardware_file=args.hardware,
            accept_slow=args.accept_slow,
        ),
        cancel=cancel,
    )
    prepared = launch.prepared
    if not quiet:
        print(f"Plan: {prepared.plan.reason}", file=sys.stderr)
        if launch.plan.verdict == "stream":
            print(f"Warning: {slow_warning(launch.plan, launch.model_name)}", file=sys.stderr)
        for note in (prepared.plan.ctx_note, *prepared.notes):
            if not note:
                continue
            print(f"  - {note}", file=sys.stderr)
    last = [-1]

    def on_event(ev: Event) -> None:
        if quiet:
            return
        if ev.state is State.LOADING and ev.progress is not None:
            pct = ev.progress.done
            if pct >= last[0] + 10 or pct == 100:
                last[0] = pct
                print(f"  loading {pct}% ({ev.progress.detail})", file=sys.stderr)
        elif ev.state is State.CRASHED and ev.message:
            print(f"  engine: {ev.message}", file=sys.stderr)

    spec = prepared.spec()
    keep_gib = services.settings().kept_state_gib
    if keep_gib:  # where conversations' states are saved (--slot-save-path)
        spec = replace(spec, state_dir=keeper_for(services.paths.cache, keep_gib).folder)
    sup = Supervisor(spec, services.paths, on_event=on_event, replan=prepared.replan_after_oom)
    if not quiet:
        print(f"Starting llama-server on {shard.name} ...", file=sys.stderr)
    t0 = time.monotonic()
    sup.start()
    stack.callback(sup.stop)
    try:
        ep = sup.wait_ready(cancel=cancel)
    except KeyboardInterrupt:
        cancel.cancel()
        raise
    if not quiet:
        print(f"Engine ready in {time.monotonic() - t0:.1f} s.", file=sys.stderr)
    # the plan's predicted reading rate: said with a re-read before any is measured
    return ep.url, ep.api_key, ep.pid, launch.plan.speed.prompt_tps


def _ask(
    client: ChatClient,
    messages: list[ChatMessage],
    settings: ChatSettings,
    cancel: CancelToken,
    *,
    as_json: bool,
    record: TurnRecord | None = None,
) -> tuple[ChatResult, ChatError | None]:
    printer = None if as_json else _Printer(sys.stdout, sys.stderr)
    try:
        outcome = run_turn(
            client,
            messages,
            settings,
            cancel=cancel,
            on_delta=printer.delta if printer is not None else None,
            record=record,
        )
    except KeyboardInterrupt:
        cancel.cancel()
        if printer is not None:
            printer.end(None)
        raise
    assert outcome.result is not None
    if printer is not None:
        printer.end(outcome.result)
    return outcome.result, outcome.error


class _Printer:
    """Content to stdout as it arrives; reasoning to stderr, dimmed on a terminal."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.dim = err.isatty()
        self.in_reasoning = False
        self.wrote_content = False

    def delta(self, d: ChatDelta) -> None:
        if d.kind == "reasoning":
            if not self.in_reasoning:
                self.in_reasoning = True
                if self.dim:
                    control(self.err, DIM)
            self.err.write(d.text)
            self.err.flush()
            return
        self._close_reasoning()
        self.out.write(d.text)
        self.out.flush()
        self.wrote_content = True

    def _close_reasoning(self) -> None:
        if self.in_reasoning:
            self.in_reasoning = False
            if self.dim:
                control(self.err, RESET)
            self.err.write("\n")
            self.err.flush()

    def end(self, result: ChatResult | None) -> None:
        self._close_reasoning()
        if self.wrote_content:
            self.out.write("\n")
            self.out.flush()
        if result is None:
            return
        facts = []
        usage, timings = result.usage, result.timings
        if usage is not None:
            about = "about " if usage.estimated else ""
            facts.append(f"{about}{usage.prompt_tokens} prompt tokens")
            facts.append(f"{about}{usage.completion_tokens} generated")
        if timings is not None and timings.predicted_per_second > 0:
            facts.append(f"{timings.predicted_per_second:.1f} tok/s")
        if (usage is not None and usage.estimated) or (timings is not None and timings.by_client):
            facts.append("measured by k3desk: the server reports none")
        if result.finish_reason == "length":
            facts.append("stopped at the token limit")
        if result.partial:
            facts.append("partial answer")
        elif no_text(result.text, result.reasoning, streaming=False):
            facts.append("no text: the model ended its turn at once; ask again")
        if facts:
            self.err.write(f"[{', '.join(facts)}]\n")
            self.err.flush()


def _record(
    stack: ExitStack,
    services: Services,
    prompt: str,
    images: tuple[PreparedImage, ...],
    settings: ChatSettings,
    system: str,
    model: str,
) -> TurnRecord:
    """``--save``: a new conversation in the chat history holding the question (committed
    now); :func:`run_turn` keeps the answer in it as it streams (every
    :data:`SAVE_EVERY_S`)."""
    from k3desk.core.app.chat import HistoryStore

    store = stack.enter_context(HistoryStore(services.paths.history_db))
    return TurnRecord.new_conversation(
        store,
        prompt,
        images=images,
        system_prompt=system,
        settings=settings,
        model=model,
        save_every=SAVE_EVERY_S,
    )


def _continued(
    stack: ExitStack,
    services: Services,
    conversation_id: int,
    prompt: str,
    images: tuple[PreparedImage, ...],
) -> TurnRecord:
    """``--continue ID``: ``prompt`` as the next question of that conversation's current
    branch (committed now), its answer kept as it streams."""
    from k3desk.core.app.chat import HistoryStore

    store = stack.enter_context(HistoryStore(services.paths.history_db))
    return TurnRecord.ask(store, conversation_id, prompt, images=images, save_every=SAVE_EVERY_S)


def _state_facts(kept: Kept) -> dict[str, Any]:
    return {
        "done": kept.done,
        "tokens": kept.tokens,
        "bytes": kept.size,
        "seconds": round(kept.seconds, 3),
        "why": kept.why,
        "reread": kept.reread,
        "predicted_s": kept.predicted_s,
        "said": kept.said(),
    }


def _say(text: str, *, quiet: bool) -> None:
    if text and not quiet:
        print(text, file=sys.stderr)
