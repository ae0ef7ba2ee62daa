"""The real llama-server on the tiny Kimi-K3 (3 shards + projector), under the supervisor."""

from __future__ import annotations

import base64
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from k3desk.core.engines.canary import (
    projector_tokens_per_image,
    write_k3_gguf,
    write_mlp_projector,
)
from k3desk.core.engines.supervisor import (
    Event,
    LaunchSpec,
    RestartPolicy,
    State,
    Supervisor,
)
from k3desk.core.errors import EngineError
from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import TinyModel
from tests.oracle import gguf_edit as ge
from tests.processes import gone_within as _gone_within

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[3]
FAST = RestartPolicy(backoff_initial=0.1, backoff_max=0.5, stop_grace=5.0)


def tiny_png(size: int = 32) -> bytes:
    """A valid RGB PNG (a gradient), written without an imaging library."""
    raw = b"".join(
        b"\x00" + b"".join(bytes((x * 8 % 256, y * 8 % 256, 128)) for x in range(size))
        for y in range(size)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, e: Event) -> None:
        self.events.append(e)

    @property
    def states(self) -> list[State]:
        out: list[State] = []
        for e in self.events:
            if not out or out[-1] is not e.state:
                out.append(e.state)
        return out


@pytest.fixture
def supervise() -> Iterator[Callable[..., Supervisor]]:
    started: list[Supervisor] = []

    def make(exe: Path, args: list[str], **kw: object) -> Supervisor:
        policy = kw.pop("policy", FAST)
        on_event = kw.pop("on_event", None)
        spec = LaunchSpec(exe, tuple(args), **kw)  # type: ignore[arg-type]
        sup = Supervisor(spec, default_paths(), policy=policy, on_event=on_event)  # type: ignore[arg-type]
        started.append(sup)
        sup.start()
        return sup

    yield make
    for sup in started:
        sup.stop()


def chat(ep_url: str, headers: dict[str, str], content: object, **extra: object) -> httpx.Response:
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        # random weights may pick end-of-message first: always generate, reproducibly
        "ignore_eos": True,
        "seed": 42,
        "chat_template_kwargs": {"thinking": False},
        **extra,
    }
    return httpx.post(f"{ep_url}/v1/chat/completions", headers=headers, json=body, timeout=60)


def test_split_model_with_projector_serves_chat_and_images(
    llama_server: Path, tiny_k3: TinyModel, supervise: Callable[..., Supervisor]
) -> None:
    assert tiny_k3.mmproj is not None
    rec = Recorder()
    args = [
        "-m",
        str(tiny_k3.first_part),
        "--mmproj",
        str(tiny_k3.mmproj),
        "-c",
        "1024",
        "-np",
        "1",
        "--jinja",
        "-ngl",
        "99",
        "--n-cpu-moe",
        "2",
    ]
    sup = supervise(llama_server, args, on_event=rec, model_bytes=tiny_k3.total_bytes)
    ep = sup.wait_ready(60)
    assert ep.host == "127.0.0.1"

    r = chat(ep.url, ep.headers, "Hello, who are you?")
    assert r.status_code == 200, r.text
    body = r.json()
    msg = body["choices"][0]["message"]
    assert msg["role"] == "assistant"
    assert (msg.get("content") or "") + (msg.get("reasoning_content") or "")  # random words
    assert body["usage"]["completion_tokens"] > 0
    text_prompt = body["usage"]["prompt_tokens"]

    # the projector is wired in: an image adds (image/patch)^2 tokens to the prompt
    url = "data:image/png;base64," + base64.b64encode(tiny_png()).decode()
    parts = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "Hello, who are you?"},
    ]
    r2 = chat(ep.url, ep.headers, parts)
    assert r2.status_code == 200, r2.text
    grown = r2.json()["usage"]["prompt_tokens"] - text_prompt
    assert grown >= projector_tokens_per_image()

    props = httpx.get(f"{ep.url}/props", headers=ep.headers, timeout=10).json()
    assert props["modalities"]["vision"] is True

    assert rec.states[:1] == [State.STARTING]
    assert State.READY in rec.states
    assert rec.states.index(State.READY) > 0
    sup.stop()
    assert rec.states[-2:] == [State.STOPPING, State.STOPPED]
    assert sup.state is State.STOPPED
    assert [a.action for a in sup.history] == ["stopped on request"]


def test_key_is_required_and_only_loopback_listens(
    llama_server: Path, tiny_k3_single: TinyModel, supervise: Callable[..., Supervisor]
) -> None:
    sup = supervise(llama_server, ["-m", str(tiny_k3_single.first_part), "-c", "512", "-np", "1"])
    ep = sup.wait_ready(60)
    assert len(ep.api_key) >= 24
    assert httpx.get(f"{ep.url}/health", timeout=10).status_code == 200
    assert chat(ep.url, {}, "hi").status_code == 401
    assert chat(ep.url, {"Authorization": "Bearer wrong"}, "hi").status_code == 401
    assert httpx.get(f"{ep.url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{ep.url}/v1/models", headers=ep.headers, timeout=10).status_code == 200

    pid = sup.pid
    assert pid is not None
    listening = [
        c.laddr
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening
    assert {a.ip for a in listening} == {"127.0.0.1"}
    assert {a.port for a in listening} == {ep.port}
    # its own process group, so stopping it reaches everything it runs
    assert os.getpgid(pid) == pid

    log = sup.log_file
    assert log is not None
    text = log.read_text()
    assert "listening on http://127.0.0.1" in text
    assert ep.api_key not in text  # the key never reaches the log
    assert "--api-key ***" in text
    assert any("listening on" in line for line in sup.tail())

    sup.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{ep.url}/health", timeout=2)


def test_key_can_be_passed_in_a_private_file(
    llama_server: Path, tiny_k3_single: TinyModel, supervise: Callable[..., Supervisor]
) -> None:
    sup = supervise(
        llama_server, ["-m", str(tiny_k3_single.first_part), "-c", "512"], api_key_file=True
    )
    ep = sup.wait_ready(60)
    assert sup.pid is not None
    cmdline = psutil.Process(sup.pid).cmdline()
    assert ep.api_key not in " ".join(cmdline)  # other local users can read cmdlines
    assert "--api-key-file" in cmdline
    key_file = Path(cmdline[cmdline.index("--api-key-file") + 1])
    assert not key_file.exists()  # read at start-up, then removed
    assert chat(ep.url, {}, "hi").status_code == 401
    assert chat(ep.url, ep.headers, "hi").status_code == 200


def test_planned_arguments_serve_chat(
    llama_server: Path,
    tiny_k3: TinyModel,
    hardware_file: Callable[[str], Path],
    supervise: Callable[..., Supervisor],
) -> None:
    from k3desk.core.gguf.validate import validate_shard_set
    from k3desk.core.hardware.profile import HardwareProfile
    from k3desk.core.planning.model import PlanOptions
    from k3desk.core.planning.plan import make_plan

    layout = validate_shard_set(tiny_k3.first_part)
    for machine in ("no-gpu-laptop-32GB", "1xH200-141GB"):
        hw = HardwareProfile.from_json_file(hardware_file(machine))
        plan = make_plan(hw, layout, PlanOptions(ctx=1024, mmproj=tiny_k3.mmproj))
        assert "--jinja" in plan.server_args
        sup = supervise(llama_server, list(plan.server_args), model_bytes=layout.total_file_bytes)
        ep = sup.wait_ready(60)
        r = chat(ep.url, ep.headers, "Hello")
        assert r.status_code == 200, (machine, plan.server_args, r.text)
        sup.stop()


def _free_listening_socket() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


# each bad input and the classification it must produce
def _missing_shard(m: TinyModel, d: Path) -> list[str]:
    m.parts[1].unlink()
    return ["-m", str(m.parts[0])]


def _truncated_shard(m: TinyModel, d: Path) -> list[str]:
    data = m.parts[2].read_bytes()
    m.parts[2].write_bytes(data[: len(data) - 4096])
    return ["-m", str(m.parts[0])]


def _truncated_header(m: TinyModel, d: Path) -> list[str]:
    data = m.parts[1].read_bytes()
    m.parts[1].write_bytes(data[:200])
    return ["-m", str(m.parts[0])]


def _wrong_arch(m: TinyModel, d: Path) -> list[str]:
    part = write_k3_gguf(d / "k9", "Tiny-K9", architecture="kimi-k9")[0]
    return ["-m", str(part)]


def _bad_magic(m: TinyModel, d: Path) -> list[str]:
    m.parts[0].write_bytes(b"hello, this is an HTML error page, not a model" * 100)
    return ["-m", str(m.parts[0])]


def _second_shard_first(m: TinyModel, d: Path) -> list[str]:
    return ["-m", str(m.parts[1])]


def _renamed_first(m: TinyModel, d: Path) -> list[str]:
    renamed = m.parts[0].with_name("Tiny-K3-first.gguf")
    m.parts[0].rename(renamed)
    return ["-m", str(renamed)]


def _bad_projector(m: TinyModel, d: Path) -> list[str]:
    proj = write_mlp_projector(d / "mmproj-bad.gguf", 64, projector_type="kimik3-moonvit")
    return ["-m", str(m.parts[0]), "--mmproj", str(proj)]


def _projector_width_mismatch(m: TinyModel, d: Path) -> list[str]:
    proj = write_mlp_projector(d / "mmproj-wide.gguf", 96)
    return ["-m", str(m.parts[0]), "--mmproj", str(proj)]


def _wrong_expert_width(m: TinyModel, d: Path) -> list[str]:
    # the header says the experts are twice as wide as their tensors are: llama.cpp's
    # loader refuses the shapes (check_tensor_dims, src/llama-model-loader.cpp)
    g = ge.load(m.parts[0])
    key = "kimi-k3.expert_feed_forward_length"
    width = g.kv(key)
    assert width is not None
    ge.save(g.set(ge.KV.of(key, ge.UINT32, 2 * int(width.scalar()))), m.parts[0])
    return ["-m", str(m.parts[0])]


def _unknown_flag(m: TinyModel, d: Path) -> list[str]:
    # what `--engine-arg --no-such-flag` hands the engine: common_params_parse refuses it
    return ["-m", str(m.parts[0]), "--no-such-flag"]


def _bad_flag_value(m: TinyModel, d: Path) -> list[str]:
    return ["-m", str(m.parts[0]), "--batch-size", "many"]


BAD_INPUTS = {
    "missing shard": (_missing_shard, "missing_shard", "Tiny-K3-IQ1_S-00002-of-00003.gguf"),
    "truncated shard": (_truncated_shard, "truncated_shard", "truncated"),
    "truncated header": (_truncated_header, "truncated_shard", "truncated"),
    "wrong architecture": (_wrong_arch, "unknown_architecture", "kimi-k9"),
    "bad magic": (_bad_magic, "bad_magic", "not a GGUF file"),
    "shard 2 first": (_second_shard_first, "split_order", "first one"),
    "renamed first shard": (_renamed_first, "split_name", "pattern"),
    "unknown projector": (_bad_projector, "unsupported_projector", "projector"),
    "projector width": (_projector_width_mismatch, "unsupported_projector", "projector"),
    "expert width in the header": (_wrong_expert_width, "load_refused", "wrong shape"),
    "unknown engine argument": (_unknown_flag, "invalid_argument", "'--no-such-flag'"),
    "bad engine argument value": (_bad_flag_value, "invalid_argument", "'--batch-size'"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_are_classified_without_pointless_restarts(
    case: str,
    llama_server: Path,
    tiny_k3: TinyModel,
    copy_model: Callable[[TinyModel], TinyModel],
    tmp_path: Path,
    supervise: Callable[..., Supervisor],
) -> None:
    damage, kind, words = BAD_INPUTS[case]
    model = copy_model(tiny_k3)
    args = damage(model, tmp_path)
    sup = supervise(llama_server, [*args, "-c", "512", "-np", "1"])
    with pytest.raises(EngineError) as err:
        sup.wait_ready(60)
    crash = sup.last_crash
    assert crash is not None
    assert crash.kind == kind, f"{crash} / tail: {sup.tail(8)}"
    assert words in str(err.value)
    assert crash.fix in str(err.value)
    assert len(sup.history) == 1  # restarting cannot fix a bad file
    assert sup.history[0].action.startswith("gave up")
    assert sup.state is State.CRASHED


def test_a_port_in_use_is_refused_before_anything_starts(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    """Whatever listens there would otherwise answer /health and be trusted."""
    with _free_listening_socket() as busy:
        port = busy.getsockname()[1]
        spec = LaunchSpec(llama_server, ("-m", str(tiny_k3_single.first_part)), port=port)
        sup = Supervisor(spec, default_paths(), policy=FAST)
        with pytest.raises(EngineError, match=f"Port {port} on 127.0.0.1 is already in use by "):
            sup.start()
    assert sup.history == []  # nothing was launched
    assert sup.pid is None


def test_kill_9_of_the_server_is_restarted(
    llama_server: Path, tiny_k3_single: TinyModel, supervise: Callable[..., Supervisor]
) -> None:
    rec = Recorder()
    sup = supervise(
        llama_server, ["-m", str(tiny_k3_single.first_part), "-c", "512", "-np", "1"], on_event=rec
    )
    ep = sup.wait_ready(60)
    first = sup.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if sup.state is State.READY and sup.pid not in (None, first):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"not restarted: {sup.state} {sup.history}")
    ep2 = sup.wait_ready(5)
    assert ep2 == ep  # same port and key: clients keep working
    assert chat(ep2.url, ep2.headers, "hi again").status_code == 200
    first_attempt = sup.history[0]
    assert first_attempt.crash is not None
    assert first_attempt.crash.kind == "killed"  # a kill -9, not the OOM killer
    assert "from outside k3desk" in first_attempt.crash.summary
    assert first_attempt.returncode == -signal.SIGKILL
    assert "restarting in" in first_attempt.action
    crashed = [e for e in rec.events if e.state is State.CRASHED]
    assert crashed
    assert not crashed[0].final
    assert len(sup.history) == 2


@pytest.mark.parametrize("guard", ["pdeathsig", "watchdog"])
def test_a_killed_app_leaves_no_server_behind(
    guard: str, llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    # "watchdog" is the path for systems without PR_SET_PDEATHSIG (macOS, BSD)
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        import k3desk.core.engines.supervisor as s
        if {guard!r} == "watchdog":
            s._LIBC = None
        from k3desk.core.engines.supervisor import LaunchSpec, Supervisor
        from k3desk.core.paths import default_paths
        spec = LaunchSpec(Path({str(llama_server)!r}),
                          ("-m", {str(tiny_k3_single.first_part)!r}, "-c", "512"))
        sup = Supervisor(spec, default_paths())
        sup.start()
        sup.wait_ready(60)
        print(sup.pid, flush=True)
        time.sleep(300)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    ) as app:
        try:
            assert app.stdout is not None
            pid = int(app.stdout.readline())
            assert psutil.Process(pid).ppid() == app.pid
            app.kill()  # SIGKILL: no cleanup code in the app runs
            app.wait()
            assert _gone_within(pid, 8.0), "llama-server outlived the app"
        finally:
            app.kill()


