"""Every model a person has, at the local API's one address, loaded when a request names it.

`k3desk api serve` starts the real llama-server b11434 as a router over the models in My
models; the clients are the real OpenAI and Anthropic SDKs with a key the person made.  The
oracles are llama-server's own: how its preset reader (common/preset.cpp) reads back the
file k3desk writes, and what a model's instance reports (/props) against the same model
launched alone by `k3desk serve`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from k3desk.core.engines.ports import free_port
from k3desk.core.engines.router import (
    PresetModel,
    RouterError,
    preset_name,
    preset_options,
    preset_text,
    router_args,
)
from k3desk.core.engines.supervisor import LaunchSpec, Supervisor
from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import write_tiny_k3
from tests.core.engines.test_local_api import _env, k3desk, serving
from tests.fixtures.twins import TwinFactory

REPO = Path(__file__).resolve().parents[3]


def test_arguments_become_the_preset_files_keys() -> None:
    args = ("-m", "/m/a.gguf", "-c", "4096", "--jinja", "--no-repack", "-ngl", "-1", "-ot",
            "blk\\.1\\.=CPU", "-ot", "blk\\.2\\.=CPU", "--temp=0.6", "--port", "9")  # fmt: skip
    assert preset_options(args) == [
        ("m", "/m/a.gguf"),
        ("c", "4096"),
        ("jinja", "true"),
        ("no-repack", "true"),
        ("ngl", "-1"),  # a negative number is a value, not an option
        ("ot", "blk\\.1\\.=CPU,blk\\.2\\.=CPU"),  # llama.cpp splits the list on ","
        ("temp", "0.6"),
    ]  # --port is the router's to give


@pytest.mark.parametrize(
    "value", ["/a/b\nc.gguf", "/a/b;c.gguf", "/a/b#c", "/a/b\t#c", " /a", "/a ", "#a"]
)
def test_a_value_the_ini_would_cut_is_refused_not_written(value: str) -> None:
    with pytest.raises(RouterError, match="cannot be written"):
        preset_text([PresetModel("m", ("-m", value))])


def test_names_keep_to_what_a_section_header_keeps() -> None:
    assert preset_name("Kimi-K3-UD-IQ1_S") == "Kimi-K3-UD-IQ1_S"
    assert preset_name("Kimi K3:Q2]x") == "Kimi-K3-Q2-x"
    with pytest.raises(RouterError):
        preset_text([PresetModel("a", ()), PresetModel("a", ())])


@pytest.mark.engine
def test_llama_server_reads_back_every_value_k3desk_writes(
    llama_server: Path, tmp_path: Path
) -> None:
    """The router lists the file's models with the arguments it will start them with:
    paths with spaces inside, '=', '[', ']' and non-ASCII letters come back byte for byte
    (and what it would cut, a ';' or '#' anywhere, is refused above)."""
    odd = tmp_path / "dir with  space=1 [x]" / "Kimï K3 ünïcode.gguf"
    models = [
        PresetModel("odd", ("-m", str(odd), "-c", "512", "--no-repack", "-ngl", "-1")),
        PresetModel("plain", ("-m", str(tmp_path / "p.gguf"), "--jinja")),
    ]
    preset = tmp_path / "models.ini"
    preset.write_text(preset_text(models), encoding="utf-8")
    spec = LaunchSpec(llama_server, router_args(str(preset)), ready_timeout=60, api_key_file=True)
    with Supervisor(spec, default_paths()) as sup:
        sup.start()
        ep = sup.wait_ready(60)
        listed = httpx.get(f"{ep.url}/v1/models", headers=ep.headers, timeout=30).json()
        sup.stop()
    args = {m["id"]: m["status"]["args"] for m in listed["data"]}
    assert set(args) == {"odd", "plain"}
    odd_args = args["odd"]
    assert odd_args[odd_args.index("--model") + 1] == str(odd)
    assert odd_args[odd_args.index("--ctx-size") + 1] == "512"
    assert odd_args[odd_args.index("--n-gpu-layers") + 1] == "-1"
    assert "--no-repack" in odd_args
    assert "--repack" not in odd_args
    assert "--jinja" in args["plain"]
    assert all(m["status"]["value"] == "unloaded" for m in listed["data"])  # none loaded yet


def _ask(url: str, key: str, model: str) -> str:
    with openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120) as client:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=4,
            extra_body={"seed": 7, "temperature": 0.0, "chat_template_kwargs": {"thinking": False}},
        )
        return reply.choices[0].message.content or ""


def _states(url: str, key: str) -> dict[str, str]:
    with openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=30) as client:
        page = client.models.list()
    return {m.id: m.model_extra["status"]["value"] for m in page.data if m.model_extra}


@pytest.mark.engine
def test_a_request_loads_the_model_it_names_one_at_a_time(
    llama_server: Path, tmp_path: Path, twin_factory: TwinFactory
) -> None:
    """Two tiny sets and the 528 GiB GrEarl set (a sparse twin), which streams from disk
    on any machine this runs on: the two are served, the third is left out and said."""
    a = write_tiny_k3(tmp_path / "a", name="Tiny-A", seed=3)
    b = write_tiny_k3(tmp_path / "b", shards=2, mmproj=True, name="Tiny-B", seed=5)
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    key = k3desk("api", "create", "agent").stdout.splitlines()[0]
    big = twin_factory("grearl-iq1s")[0]
    for part in (a.first_part, b.first_part, big):
        added = k3desk("models", "add", str(part))
        assert added.returncode == 0, added.stderr
    url = f"http://127.0.0.1:{port}/v1"

    # each model alone, as `k3desk serve` runs it: what its instance says of itself
    alone = {}
    for name, m, more in (("Tiny-A", a, ()), ("Tiny-B", b, ("--mmproj", str(b.mmproj)))):
        with serving(str(m.first_part), *more, "--engine", str(llama_server)):
            props = httpx.get(f"{url.removesuffix('/v1')}/props", timeout=30,
                              headers={"Authorization": f"Bearer {key}"}).json()  # fmt: skip
            alone[name] = (_ask(url, key, name), _facts(props))

    with _api_serve(llama_server) as out:
        assert "Tiny-A" in out
        assert "Tiny-B" in out
        big_name = big.name.split("-00001-of-")[0]
        left = next(line for line in out.splitlines() if line.startswith(f"Left out: {big_name}"))
        assert "does not fit in RAM" in left
        assert f"k3desk serve --accept-slow {big}" in left
        assert _states(url, key) == {"Tiny-A": "unloaded", "Tiny-B": "unloaded"}
        # a request names Tiny-B: it is loaded with its own plan and answers
        assert _ask(url, key, "Tiny-B") == alone["Tiny-B"][0]
        assert _states(url, key) == {"Tiny-A": "unloaded", "Tiny-B": "loaded"}
        assert _props(url, key, "Tiny-B") == alone["Tiny-B"][1]  # vision included
        # then Tiny-A, through Anthropic's SDK: Tiny-B makes way (one loaded at a time)
        with anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=key,
                                 max_retries=0, timeout=120) as client:  # fmt: skip
            msg = client.messages.create(
                model="Tiny-A", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
            )
        assert msg.model == "Tiny-A"
        assert _states(url, key) == {"Tiny-A": "loaded", "Tiny-B": "unloaded"}
        assert _props(url, key, "Tiny-A") == alone["Tiny-A"][1]
        assert _ask(url, key, "Tiny-A") == alone["Tiny-A"][0]
        # the set left out, named by a request: why, and what to do, in each API's shape
        with pytest.raises(openai.BadRequestError, match="does not fit in RAM") as refused:
            _ask(url, key, big_name)
        assert f"k3desk serve --accept-slow {big}" in str(refused.value)
        client = anthropic.Anthropic(
            base_url=url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=120
        )
        with client, pytest.raises(anthropic.BadRequestError, match="accept-slow") as said:
            client.messages.create(
                model=big_name, max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
            )
        assert said.value.type == "invalid_request_error"  # Anthropic's error shape
        assert _states(url, key)["Tiny-A"] == "loaded"  # nothing was unloaded for it
        # a model nobody has: the router's own answer, the endpoint still up
        with pytest.raises(openai.BadRequestError, match="not found"):
            _ask(url, key, "Tiny-C")
        with pytest.raises(openai.AuthenticationError):
            _ask(url, "k3-wrong", "Tiny-A")
        assert _states(url, key)["Tiny-A"] == "loaded"


def _facts(props: dict[str, object]) -> tuple[object, ...]:
    settings = props["default_generation_settings"]
    assert isinstance(settings, dict)
    return (props["model_path"], props["total_slots"], settings["n_ctx"], props["modalities"])


def _props(url: str, key: str, model: str) -> tuple[object, ...]:
    got = httpx.get(f"{url.removesuffix('/v1')}/props", params={"model": model}, timeout=30,
                    headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    return _facts(got.json())


class _api_serve:
    """`k3desk api serve` until its router is ready; what it printed; then SIGTERM."""

    def __init__(self, engine: Path, *args: str) -> None:
        env = {**_env(), "K3DESK_LLAMA_SERVER": str(engine)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "k3desk", "api", "serve", *args], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def __enter__(self) -> str:
        assert self.proc.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 120
        while not any(line.startswith("Engine pid") for line in seen):
            line = self.proc.stdout.readline()
            if not line or time.monotonic() > deadline:
                pytest.fail("k3desk api serve did not get ready:\n" + "".join(seen))
            seen.append(line)
        return "".join(seen)

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
