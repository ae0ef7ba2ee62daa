"""Sets written by llama.cpp's own tools run end to end in k3desk, as a user runs them.

The tiny wide Kimi-K3 quantized by ``llama-quantize`` (Q4_K_M, Q2_K, Q8_0 and
IQ2_XXS with an imatrix from ``llama-imatrix``) and split by ``llama-gguf-split``
(by tensor count and by size): each passes ``k3desk validate`` and ``k3desk plan``,
and answers one chat with an image through ``k3desk chat`` (which starts
llama-server with the projector, and stops it); one is served by ``k3desk serve``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from PIL import Image

import k3desk.cli as cli
from k3desk.app import Services
from k3desk.core.gguf.validate import inspect_shard_set
from k3desk.core.k3arch import TINY_K3_WIDE
from tests.oracle.llama import QUANT_TYPES, OracleSets
from tests.oracle.processes import serving

Run = Callable[..., tuple[int, str, str]]

# what llama-quantize makes of the wide rows: the type the big tensors get
MAIN_TYPE = {"Q4_K_M": "Q4_K", "Q2_K": "Q2_K", "Q8_0": "Q8_0", "IQ2_XXS": "IQ2_XXS"}


@pytest.fixture
def k3(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """``k3desk ARGS`` through the real CLI entry point, in this process."""

    def run(*argv: str | Path) -> tuple[int, str, str]:
        rc = cli.main([str(a) for a in argv], Services())
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("img") / "red.png"
    Image.new("RGB", (48, 40), (200, 30, 30)).save(p)
    return p


def _sets(oracle_sets: OracleSets) -> list[tuple[str, list[Path]]]:
    return oracle_sets.all_sets()


SET_IDS = [f"{t}{s}" for t in QUANT_TYPES for s in ("", "-by-count", "-by-size")]


@pytest.mark.engine
@pytest.mark.parametrize("index", range(12), ids=SET_IDS)
def test_validate_and_plan_pass_on_what_llama_cpp_wrote(
    index: int, oracle_sets: OracleSets, k3: Run
) -> None:
    label, parts = _sets(oracle_sets)[index]
    qtype = label.split()[0]
    # any part will do for validate, as a user may pick any
    rc, out, err = k3("validate", parts[-1])
    assert rc == 0, err
    assert err == ""
    assert "OK: every part is present and consistent; llama.cpp b11434 loads this set." in out
    assert f"Parts:        {len(parts)} in " in out
    report = inspect_shard_set(parts[0])
    assert report.notes == ()
    assert report.suspicious == ()
    layout = report.layout
    assert [p.name for p in layout.parts] == [p.name for p in parts]
    assert layout.tensor_count == 156
    assert layout.type_counts[MAIN_TYPE[qtype]] >= 40  # real k-/i-quant blocks, no fallback
    conv = next(t for t in layout.tensors if t.name == "blk.0.ssm_conv1d_q.weight")
    assert conv.shape == (TINY_K3_WIDE.conv_kernel, 1, 256)  # what llama.cpp writes: 3-D
    rc, out, err = k3("plan", parts[0], "--mmproj", oracle_sets.mmproj, "--ctx", "1024")
    assert rc == 0, err
    assert "Command:" in out or "llama-server" in out
    rc, out, err = k3("plan", parts[0], "--mmproj", oracle_sets.mmproj, "--json")
    assert rc == 0, err
    plan = json.loads(out)
    assert plan["parts"] == len(parts)
    assert plan["suspicious"] == []
    assert plan["verdict"] != "no-fit"


@pytest.mark.engine
def test_each_set_answers_a_chat_with_an_image(
    oracle_sets: OracleSets, llama_server: Path, k3: Run, picture: Path
) -> None:
    failures = []
    for label, parts in _sets(oracle_sets):
        args: tuple[str | Path, ...] = ("--mmproj", oracle_sets.mmproj, "--ctx", "1024")
        args += ("--json", "--no-thinking")
        args += ("--max-tokens", "2", "--seed", "1", "--engine", llama_server)
        rc, out, err = k3("chat", parts[0], *args, "--image", picture, "What colour is it?")
        if rc != 0:
            failures.append(f"{label}: exit {rc}\n{err[-2000:]}")
            continue
        answer = json.loads(out)
        # the projector's image embeddings ((32/8)^2 = 16) are in the prompt
        if answer["usage"]["prompt_tokens"] < 16 or not answer["usage"]["completion_tokens"]:
            failures.append(f"{label}: {answer['usage']}")
    assert failures == [], "\n".join(failures)


@pytest.mark.engine
def test_serve_a_split_set_and_chat_with_an_image_over_http(
    oracle_sets: OracleSets, llama_server: Path, picture: Path
) -> None:
    parts = oracle_sets.by_size["IQ2_XXS"]
    with serving(str(parts[0]), "--mmproj", str(oracle_sets.mmproj), "--ctx", "1024",
                 "--engine", str(llama_server)) as (_, facts):  # fmt: skip
        url, key = facts["URL"], facts["API key"]
        image = "data:image/png;base64," + base64.b64encode(picture.read_bytes()).decode()
        content = [
            {"type": "text", "text": "What colour is it?"},
            {"type": "image_url", "image_url": {"url": image}},
        ]
        r = httpx.post(
            f"{url}/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"messages": [{"role": "user", "content": content}], "max_tokens": 2},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] >= 16
