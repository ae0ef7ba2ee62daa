"""``k3desk plan`` and ``k3desk tiers`` as a person runs them."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

import k3desk.cli
from k3desk.app import Services
from k3desk.core.engines.canary import write_mlp_projector
from k3desk.core.units import GiB
from k3desk.devtools.tinyk3 import TinyModel

Run = Callable[..., tuple[int, str, str]]
VERDICTS = {"gpu", "hybrid", "cpu", "stream", "no-fit", "n/a"}


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    def go(*args: str) -> tuple[int, str, str]:
        rc = k3desk.cli.main(list(args), Services())
        out = capsys.readouterr()
        return rc, out.out, out.err

    return go


def test_plan_prints_verdict_command_memory_layers_and_speed(
    run: Run, twin_factory: Callable[[str], list[Path]], hardware_file: Callable[[str], Path]
) -> None:
    shard = twin_factory("grearl-iq1s")[0]
    rc, out, err = run(
        "plan",
        str(shard),
        "--hardware",
        str(hardware_file("512GB-ddr5-96GB-vram")),
        "--ctx",
        "32768",
    )
    assert rc == 0, err
    assert "Verdict: hybrid" in out
    command = next(
        line.strip() for line in out.splitlines() if line.strip().startswith("llama-server")
    )
    argv = shlex.split(command)
    assert argv[1:3] == ["-m", str(shard)]
    assert argv[argv.index("-c") + 1] == "32768"
    assert argv[argv.index("--n-cpu-moe") + 1].isdigit()
    assert "CUDA0" in out
    assert "RAM" in out
    assert "budget" in out
    assert "routed experts:     layers 1-" in out
    assert "Speed: about" in out
    assert "tok/s" in out
    assert "--n-cpu-moe 93; this plan keeps" in out


def test_plan_json_is_the_whole_plan(
    run: Run, twin_factory: Callable[[str], list[Path]], hardware_file: Callable[[str], Path]
) -> None:
    shard = twin_factory("6block-iq1s-xs")[0]
    rc, out, err = run("plan", str(shard), "--hardware", str(hardware_file("8xH100-2TB")), "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["tier"] == "6block-iq1s-xs"
    assert data["verdict"] == "gpu"
    assert data["server_args"][:2] == ["-m", str(shard)]
    assert shlex.split(data["command"])[1:] == data["server_args"]
    assert len(data["layers"]) == 93
    assert all(d["used"] <= d["capacity"] for d in data["devices"])
    assert data["speed"]["low_tps"] <= data["speed"]["expected_tps"] <= data["speed"]["high_tps"]
    assert any("The 6block card runs with --n-cpu-moe 93" in n for n in data["notes"])


def test_plan_with_projector_and_errors_name_the_file(
    run: Run,
    twin_factory: Callable[[str], list[Path]],
    hardware_file: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    shard = twin_factory("grearl-iq1s")[0]
    hw = str(hardware_file("8xH100-2TB"))
    mmproj = tmp_path / "mmproj-BF16.gguf"
    write_mlp_projector(mmproj, 7168)
    rc, out, _ = run("plan", str(shard), "--hardware", hw, "--mmproj", str(mmproj))
    assert rc == 0
    assert f"--mmproj {mmproj}" in out

    # a model shard passed as the projector is named as the wrong file, not planned
    rc, _, err = run("plan", str(shard), "--hardware", hw, "--mmproj", str(shard))
    assert rc == 1
    assert "is not a vision projector" in err
    assert "Traceback" not in err

    rc, _, err = run("plan", str(shard), "--hardware", hw, "--mmproj", str(tmp_path / "gone.gguf"))
    assert rc == 1
    assert "gone.gguf does not exist" in err
    assert "Traceback" not in err
    rc, _, err = run("plan", str(tmp_path / "missing-00001-of-00002.gguf"), "--hardware", hw)
    assert rc == 1
    assert "missing-00001-of-00002.gguf" in err
    small = str(hardware_file("512GB-ddr5-96GB-vram"))
    rc, _, err = run("plan", str(shard), "--hardware", small, "--n-cpu-moe", "0")
    assert rc == 1
    assert "--n-cpu-moe 0" in err
    assert "Use a larger --n-cpu-moe" in err


def test_tiers_lists_every_tier_with_a_verdict_for_a_hardware_file(
    run: Run, hardware_file: Callable[[str], Path]
) -> None:
    rc, out, err = run("tiers", "--hardware", str(hardware_file("1xRTX5090-256GB")))
    assert rc == 0, err
    for name in ("IQ1_S-XS", "IQ1_S-XXS-832e", "UD-IQ1_S", "Q3_K_S", "IQ2_XXS"):
        assert name in out
    assert "streams from disk:" in out
    assert "No tier fits in the memory of" in out
    assert "The closest (the one missing the least memory) is UD-IQ1_S (vcruz305)" in out
    assert "Quality order:" in out
    # what each rank rests on, and which tiers' files are a guess, on every row
    rows = {line.split()[2]: line for line in out.splitlines() if line[:1].isdigit()}
    assert " GUESSED " in rows["Q3_K_S"]
    assert " card " in rows["UD-IQ1_S"]
    # every row carries the id `k3desk download` takes, and the text says how to use it
    ids = [line.split()[1] for line in out.splitlines() if line[:1].isdigit()]
    assert sorted(ids) == sorted(Services().catalog.ids)
    assert "Download a tier by its id: `k3desk download vcruz305-ud-iq1s`." in out
    assert "What each rank rests on:" in out
    assert "made without an importance matrix, which llama.cpp requires for IQ1_S" in out


def test_tiers_json_says_what_each_rank_rests_on(
    run: Run, hardware_file: Callable[[str], Path]
) -> None:
    rc, out, err = run("tiers", "--json", "--hardware", str(hardware_file("8xH100-2TB")))
    assert rc == 0, err
    data = json.loads(out)
    tiers = {t["id"]: t for t in data["tiers"]}
    assert data["recommended"] == "atomicchat-q3ks"
    assert "Its files are guessed" in data["summary"]
    assert tiers["atomicchat-q3ks"]["known"] is False
    assert tiers["atomicchat-q3ks"]["files_guessed"].startswith("its files are guessed")
    assert tiers["6block-iq1s-xs"]["files_guessed"] == ""
    grearl = tiers["grearl-iq1s"]
    assert grearl["imatrix"] is False
    assert len(grearl["quality_shortcomings"]) == 2
    assert grearl["quality"][0]["scope"] == "weight-space"
    assert grearl["rank"] > tiers["6block-iq1s-xs"]["rank"]


def test_tiers_json_on_this_machine_gives_every_tier_a_verdict_and_shortfall(run: Run) -> None:
    rc, out, err = run("tiers", "--json")
    assert rc == 0, err
    data = json.loads(out)
    tiers = data["tiers"]
    assert len(tiers) >= 10
    assert all(t["verdict"] in VERDICTS for t in tiers)
    for t in tiers:
        if t["verdict"] in ("stream", "no-fit"):
            assert t["shortfall_bytes"] > 0, t["id"]
            assert "more RAM" in t["why_not"] or t["reference"], t["id"]
    small = psutil.virtual_memory().total < 256 * GiB
    if small:  # this machine is far below the smallest tier (307 GiB)
        assert data["recommended"] is None
        assert all(t["verdict"] in ("no-fit", "stream") for t in tiers)
        # after what the free disk rules out, when it does
        assert "No tier fits in the memory of this machine" in data["summary"]


def test_plan_without_ctx_fits_the_default_to_the_model_and_an_explicit_ctx_is_checked(
    run: Run, tiny_k3: TinyModel, hardware_file: Callable[[str], Path]
) -> None:
    shard = str(tiny_k3.first_part)
    hw = str(hardware_file("no-gpu-laptop-32GB"))
    rc, out, err = run("plan", shard, "--hardware", hw)
    assert rc == 0, err
    assert " -c 4096 " in out
    assert "Memory (GiB), context 4096:" in out
    assert f"Context: 4096 tokens, the most {tiny_k3.first_part.name} was trained for" in out
    rc, _, err = run("plan", shard, "--hardware", hw, "--ctx", "8192")
    assert rc == 1
    assert "The context size 8192 exceeds what" in err
    assert "Use --ctx 4096 or less." in err
    assert "Traceback" not in err
