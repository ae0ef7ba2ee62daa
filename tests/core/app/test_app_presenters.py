"""Presenters: what a table's cells say (text, tooltip, tone), decided without Qt, from
the core's own results on the shipped hardware files, the catalog, a real tiny model and
real probe records."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from k3desk.core.app.library import add_model, list_models
from k3desk.core.app.presenters import Cell
from k3desk.core.app.presenters import cluster_engine as engine_p
from k3desk.core.app.presenters import cluster_nodes as nodes_p
from k3desk.core.app.presenters import downloads as dl_p
from k3desk.core.app.presenters import endpoints as ep_p
from k3desk.core.app.presenters import my_models as mine_p
from k3desk.core.app.presenters import tiers as tiers_p
from k3desk.core.app.services import Services
from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import TierRequest, judge_tiers
from k3desk.core.cluster.assess import assess_sparkinfer
from k3desk.core.cluster.endpoints import RemoteEndpoint
from k3desk.core.cluster.members import Member
from k3desk.core.cluster.nodes import Cluster, Node
from k3desk.core.cluster.plan import NodeBudget
from k3desk.core.cluster.probe import CopyCheck, FileCheck, NodeReport
from k3desk.core.cluster.sparkinfer import SparkInferConfig
from k3desk.core.hub.model import DownloadRequest, DownloadSummary
from k3desk.devtools.tinyk3 import TinyModel
from tests.core.cluster.reports import report
from tests.fixtures.hardware import HARDWARE_DIR


@pytest.fixture
def services(k3_home: Path) -> Services:
    return Services()


# ------------------------------------------------------------------ cluster nodes
def test_a_node_row_says_not_probed_unreachable_or_what_the_probe_found(
    services: Services,
) -> None:
    node = Node("spark-2.lan", user="k3", port=2222, name="spark-2")
    (label, ssh, *rest) = nodes_p.node_cells(node, None, stale_tier=False)
    assert (label.text, ssh.text) == ("spark-2", "k3@spark-2.lan:2222")
    assert [c.text for c in rest] == ["—", "—", "—", "not probed"]
    assert all(c.tone is None for c in rest)

    err = "ssh: connect to host spark-2.lan port 2222: Connection refused\nCheck the port."
    cells = nodes_p.node_cells(node, NodeReport(node, ok=False, error=err), False)
    assert [c.text for c in cells[2:]] == ["unreachable", "—", "—", err.splitlines()[0]]
    assert (cells[2].tone, cells[5].tone) == ("danger", "danger")
    assert cells[5].tooltip == err  # the whole message, hint included
    assert nodes_p.node_cells(node, NodeReport(node, ok=False), False)[5].text == "probe failed"

    hw = services.load_hardware(HARDWARE_DIR / "3xGB10-node.json")
    rep = NodeReport(node, ok=True, hardware=hw, note="k3desk is not installed there")
    cells = nodes_p.node_cells(node, rep, stale_tier=True)
    assert cells[2].text == "GB10 (sm_121)"
    assert cells[2].tone is None
    assert cells[2].tooltip.endswith("\nk3desk is not installed there")
    assert "unified" in cells[3].text
    assert cells[4].tooltip == f"{cells[4].text} free at {hw.disk.probed_path}"  # type: ignore[union-attr]
    assert cells[5].text == "probe again to check this tier"
    assert cells[5].tone is None
    assert nodes_p.node_cells(node, rep, stale_tier=False)[5].text == "not checked"


def test_a_nodes_copy_is_green_only_when_complete_and_a_node_without_gpus_is_amber(
    services: Services,
) -> None:
    node = Node("10.0.0.7")
    laptop = services.load_hardware(HARDWARE_DIR / "no-gpu-laptop-32GB.json")
    files = (FileCheck("k3-00001-of-00002.gguf", True, 10, True),)
    whole = CopyCheck("/models/k3", True, files, 10, ())
    broken = CopyCheck(
        "/models/k3",
        False,
        (*files, FileCheck("k3-00002-of-00002.gguf", True, 3, False, "truncated")),
        13,
        ("k3-00002-of-00002.gguf is truncated",),
    )
    ok = nodes_p.node_cells(node, NodeReport(node, True, hardware=laptop, copy=whole), False)
    assert ok[1].text == "10.0.0.7"
    assert ok[2].text.startswith("none")
    assert ok[2].tone == "warn"
    assert ok[5] == Cell(whole.summary(), whole.summary(), "ok")
    bad = nodes_p.node_cells(node, NodeReport(node, True, hardware=laptop, copy=broken), False)
    assert bad[5].tone == "danger"
    assert bad[5].text.startswith("incomplete: ")
    assert bad[5].tooltip.splitlines()[1] == "k3-00002-of-00002.gguf is truncated"


# ------------------------------------------------------------------ tiers
def test_tier_rows_star_the_pick_and_colour_the_verdict(services: Services) -> None:
    path = HARDWARE_DIR / "8xH100-2TB.json"
    hw = services.load_hardware(path)
    judged = judge_tiers(TierRequest(hw, Subject.hardware_file(path, hw)), services.catalog)
    starred = []
    for row in judged.rows:
        cells = tiers_p.judged_row_cells(row)
        assert len(cells) == len(tiers_p.COLUMNS)
        if cells[0].text.startswith("★ "):
            starred.append(row.tier.id)
        verdict = cells[tiers_p.VERDICT_COLUMN]
        assert verdict.text == row.label
        assert verdict.tone == ("ok" if row.fits else "warn" if row.kind == "stream" else "danger")
        assert verdict.tooltip.startswith(row.verdict.reason)
        assert cells[tiers_p.SPEED_COLUMN].text == (row.speed.text() if row.speed else "—")
        assert all(c.tone is None for i, c in enumerate(cells) if i != tiers_p.VERDICT_COLUMN)
        t = row.tier
        assert cells[0].text.endswith("  (reference)") == t.reference
        assert cells[3].text.endswith(" · guessed") == bool(t.files_guessed)
        if t.files_guessed:
            assert cells[0].tooltip.endswith(tiers_p.files_note(t))
    assert starred == [judged.chosen.tier.id]  # type: ignore[union-attr]
    q3 = tiers_p.judged_row_cells(next(r for r in judged.rows if r.kind == "hybrid"))
    assert "--n-cpu-moe " in q3[tiers_p.VERDICT_COLUMN].tooltip


def test_quality_and_vision_texts(services: Services) -> None:
    tiers = {t.id: t for t in services.catalog.tiers}
    q8 = tiers["atomicchat-q8_0"]
    text, tip = tiers_p.quality_text(q8)
    assert text.endswith(" *")  # a caveat is marked, and said in the tooltip
    assert tip.endswith(f"Caveat: {q8.quality_caveat}")
    assert len(text) <= 36
    assert tiers_p.vision_text(tiers["grearl-iq1s"]) == "no"
    assert tiers_p.vision_text(q8) == "yes (fork build)"
    assert tiers_p.quality_text(replace(q8, quality=())) == ("not published", q8.quality_caveat)


# ------------------------------------------------------------------ my models
def test_my_models_rows_say_what_the_set_is_and_where_it_runs(
    services: Services, tiny_k3: TinyModel
) -> None:
    added = add_model(services, tiny_k3.parts[1])
    assert mine_p.added_text(added) == f"Added {added.added[0].name}."
    again = add_model(services, tiny_k3.first_part)
    assert mine_p.added_text(again).endswith("is already in your models.")
    path = HARDWARE_DIR / "8xH100-2TB.json"
    hw = services.load_hardware(path)
    judged = list_models(services, hw, Subject.hardware_file(path, hw))
    (row,) = judged.rows
    cells = mine_p.row_cells(row)
    assert len(cells) == len(mine_p.COLUMNS)
    assert cells[0].tooltip.startswith(f"{tiny_k3.first_part}\n3 part(s)")
    assert cells[mine_p.VERDICT_COLUMN].text == row.label
    assert cells[mine_p.VERDICT_COLUMN].tone == mine_p.verdict_tone(row)
    assert (cells[4].text, cells[4].tooltip) == ("yes", str(tiny_k3.mmproj))
    assert cells[5] == Cell("—", "Not a catalog tier (its headers match none).")
    # D21: the folder the files are in, not how the model got to the list
    assert cells[6].text.endswith(tiny_k3.first_part.parent.name)
    assert cells[6].tooltip.startswith(f"{tiny_k3.first_part.parent}\nAdded by hand")
    summary = mine_p.summary_text(judged)
    assert summary.startswith(f"1 model, judged for the machine in {path.name}")
    assert mine_p.summary_text(replace(judged, rows=())).startswith(mine_p.EMPTY)


# ------------------------------------------------------------------ downloads
@dataclass
class _File:
    path: str
    size: int = 0
    done: int = 0
    state: str = "queued"
    note: str = ""


@dataclass
class _Download:
    request: DownloadRequest
    target: Path
    status: str = "running"
    files: dict[str, _File] = field(default_factory=dict)
    total: int = 0
    done: int = 0
    speed: float = 0.0
    eta: float | None = None
    free: int = 0
    warnings: list[str] = field(default_factory=list)
    summary: DownloadSummary | None = None
    error: str = ""
    waiting: str = ""


def test_a_download_says_its_numbers_notes_and_files_in_name_order(tmp_path: Path) -> None:
    req = DownloadRequest("org/k3-gguf", ("*.gguf",), label="grearl-iq1s")
    st = _Download(
        req,
        tmp_path,
        files={
            "b.gguf": _File("b.gguf", 2048, 1024, "downloading"),
            "a.gguf": _File("a.gguf", 1024, 1024, "failed", "sha256 mismatch"),
            "c.gguf": _File("c.gguf"),
        },
        total=3072,
        done=2048,
        speed=1024.0,
        eta=61,
        free=10 * 1024**3,
        warnings=["w1", "w2", "w3", "w4"],
        error="The disk is full.",
    )
    assert dl_p.title_text(st) == "grearl-iq1s: running"
    assert dl_p.where_text(st) == f"org/k3-gguf → {tmp_path}"
    assert dl_p.numbers_text(st) == (
        "2.0 KiB of 3.0 KiB  ·  1.0 KiB/s  ·  ETA 1 min 01 s  ·  free on disk 10.0 GiB"
    )
    assert dl_p.notes(st) == ["The disk is full.", "w2", "w3", "w4"]
    lines = dl_p.file_rows(st)
    assert [(f.path, f.permille) for f in lines] == [
        ("a.gguf", 1000),
        ("b.gguf", 500),
        ("c.gguf", 0),
    ]
    assert lines[0].state == Cell("✗ failed", "sha256 mismatch")
    assert lines[1].state.text == "downloading"
    st.status = "done"
    st.summary = DownloadSummary("org/k3-gguf", "main", str(tmp_path), 3, 3072, 3072, 0, (), 75.0)
    assert dl_p.numbers_text(st) == "3 files, 3.0 KiB, all verified in 1 min 15 s"
    st.status, st.summary = "paused", None
    assert dl_p.numbers_text(st) == "2.0 KiB of 3.0 KiB  ·  free on disk 10.0 GiB"


def test_a_download_without_a_rate_yet_or_without_the_hub_says_so(tmp_path: Path) -> None:
    req = DownloadRequest("org/k3-gguf", ("*.gguf",), label="grearl-iq1s")
    st = _Download(req, tmp_path, total=3072, done=1024)
    assert dl_p.numbers_text(st) == "1.0 KiB of 3.0 KiB  ·  measuring speed  ·  ETA —"
    st.status, st.waiting = "waiting for the Hub", "no data for 12 s: connection refused"
    assert dl_p.title_text(st) == "grearl-iq1s: waiting for the Hub"
    assert dl_p.numbers_text(st) == (
        "1.0 KiB of 3.0 KiB  ·  no data for 12 s: connection refused"
    )


# ------------------------------------------------------------------ attached servers
def test_an_attached_server_row_says_its_kind_key_and_whether_the_chat_uses_it() -> None:
    fresh = RemoteEndpoint("vllm-h200", "http://10.0.0.21:8008")
    cells = ep_p.endpoint_cells(fresh, in_use=False)
    assert [c.text for c in cells] == [
        "vllm-h200",
        "http://10.0.0.21:8008",
        "not checked yet",
        "—",
        "none or this session's",
        "",
    ]
    assert all(c.tone is None for c in cells)
    assert [c.tooltip for c in cells] == [c.text for c in cells]
    mute = RemoteEndpoint(
        "bridge",
        "http://spark-1:8010",
        model="kimi-k3",
        key_env="BRIDGE_KEY",
        server="sparkinfer-bridge",
        server_problem="it answers /v1/models but not /v1/chat/completions",
    )
    cells = ep_p.endpoint_cells(mute, in_use=True)
    assert cells[2].text == mute.server_text()
    assert cells[2].tone == "danger"
    assert (cells[3].text, cells[4].text) == ("kimi-k3", "from $BRIDGE_KEY")
    assert cells[5] == Cell("in use", None, "ok")
    kept = RemoteEndpoint("box", "http://box:8080", key_in_keyring=True)
    assert ep_p.endpoint_cells(kept, False)[4].text == "keyring"


# ------------------------------------------------------------------ cluster engine
def test_the_cluster_verdict_plan_and_processes(services: Services) -> None:
    nodes = tuple(
        Node(host=f"spark{i}", address=f"10.0.0.{11 + i}", model_path="/models/k3")
        for i in range(3)
    )
    cfg = SparkInferConfig(Cluster("spark", nodes))
    tier = next(t for t in services.catalog.tiers if t.id == "vcruz305-ud-iq1s")
    before = assess_sparkinfer(cfg, tier=tier)
    assert engine_p.verdict_line(before) == (
        "SparkInfer TP3: can start (probe for the memory plan)",
        None,
    )
    after = assess_sparkinfer(cfg, tier=tier, reports=[report(n) for n in nodes])
    head, tone = engine_p.verdict_line(after)
    assert after.plan is not None
    assert head.startswith("SparkInfer TP3: fits")
    assert tone == {"fits": "ok", "tight": "warn"}[after.plan.verdict]
    refused = assess_sparkinfer(
        cfg, tier=tier, reports=[report(nodes[0], "1xH200-141GB"), *map(report, nodes[1:])]
    )
    assert engine_p.verdict_line(refused) == ("SparkInfer TP3: refused", "danger")
    rank0 = engine_p.plan_cells(after.plan.nodes[0])
    assert [c.text for c in rank0[:2]] == ["spark0", "rank 0 (coordinator, bridge)"]
    assert all(c.tone is None for c in rank0)

    short = NodeBudget("spark1", "rank 1", "RAM", 10 * 2**30, 12 * 2**30, "80 GiB short", False,
                       ("the KV cache takes 2 GiB",))  # fmt: skip
    cells = engine_p.plan_cells(short)
    assert [c.text for c in cells] == [
        "spark1", "rank 1", "12.0 GiB", "10.0 GiB", "RAM", "80 GiB short"
    ]  # fmt: skip
    assert [c.tone for c in cells] == [None, None, "danger", None, None, "danger"]
    assert cells[3].tooltip == "10.0 GiB\nthe KV cache takes 2 GiB"
    unknown = engine_p.plan_cells(replace(short, capacity=None, disk_ok=None))
    assert unknown[3].text == "unknown"
    assert [c.tone for c in unknown] == [None] * 6

    member = Member("rank 0", "coordinator", "spark0", "k3@spark0:22", "running", True, 4242,
                    "/tmp/rank0.log")  # fmt: skip
    cells = engine_p.member_cells(member)
    assert [c.text for c in cells] == [
        "rank 0", "spark0", "k3@spark0:22", "coordinator", "running", "4242"
    ]  # fmt: skip
    assert [c.tone for c in cells] == [None, None, None, None, "ok", None]
    assert cells[0].tooltip == "rank 0\nlog: /tmp/rank0.log"
    ended = engine_p.member_cells(replace(member, state="ended: exit 1", pid=None, log=""))
    assert (ended[4].tone, ended[5].text, ended[4].tooltip) == ("danger", "", "ended: exit 1")
    assert engine_p.member_cells(replace(member, state="waiting"))[4].tone is None
