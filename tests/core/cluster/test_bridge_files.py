"""SparkInfer's HTTP bridge needs the model's tokenizer folder and chat template on rank 0.
The probe looks for them (in the same ssh round trip as the rest) and the assessment refuses
a launch up front when they are not there, instead of the bridge exiting 2 later."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from k3desk.core.cluster.assess import assess_sparkinfer
from k3desk.core.cluster.nodes import Cluster, ClusterStore, Node
from k3desk.core.cluster.probe import probe_cluster
from k3desk.core.cluster.sparkinfer import SparkInferConfig, check_sparkinfer
from k3desk.core.paths import default_paths
from tests.fakes.sparkinfer.stand_in import write_model_extras
from tests.fixtures.sshd import SshServer

# where the recipe gets them (its README, step 1)
FETCH_TEMPLATE = '--include "k3_chat_template.jinja"'
FETCH_TOKENIZER = "the recipe fetches it from moonshotai/Kimi-K3 on rank 0 with `hf download"


def nodes(sshd: SshServer, tag: str) -> tuple[Node, ...]:
    return tuple(sshd.node(f"{tag}{i}") for i in range(3))


def probe(cfg: SparkInferConfig):  # type: ignore[no-untyped-def]
    return probe_cluster(
        cfg.cluster, ClusterStore(default_paths()).known_hosts, rank0_paths=cfg.bridge_paths
    )


def bridge_refusals(refusals: tuple[str, ...]) -> list[str]:
    return [r for r in refusals if "HTTP bridge" in r]


def test_the_probe_reports_rank0_bridge_files_and_the_assessment_refuses_a_missing_one(
    sshd: SshServer,
) -> None:
    ns = nodes(sshd, "bridge-")
    tokenizer, template = write_model_extras(ns[0].model_path)
    cfg = SparkInferConfig(Cluster("bf", ns))
    assert cfg.bridge_paths == (str(tokenizer), str(template))

    # both there: the probe says so for rank 0 only, and nothing is refused for them
    reports = probe(cfg)
    assert all(r.ok for r in reports)
    assert reports[0].paths == {str(tokenizer): "dir", str(template): "file"}
    assert reports[1].paths == {}
    assert reports[0].to_dict()["paths"] == {str(tokenizer): "dir", str(template): "file"}
    assessed = assess_sparkinfer(cfg, reports=reports)
    assert bridge_refusals(assessed.refusals) == []
    assert not [w for w in assessed.warnings if "HTTP bridge" in w]

    # the chat template is gone: refused up front, naming the file, where it comes from
    template.unlink()
    reports = probe(cfg)
    assert reports[0].paths[str(template)] == "missing"
    refused = bridge_refusals(assess_sparkinfer(cfg, reports=reports).refusals)
    assert len(refused) == 1
    assert refused[0].startswith(
        f"Rank 0 ({ns[0].label}) has no chat template (K3_CHAT_TEMPLATE) at {template}: "
        "there is nothing there. "
    )
    assert FETCH_TEMPLATE in refused[0]
    assert "vcruz305/Kimi-K3-GGUF" in refused[0]
    assert str(tokenizer) not in refused[0]
    # the same refusal stops `k3desk cluster serve` (which checks before starting)
    assert bridge_refusals(check_sparkinfer(cfg, reports=reports).refusals) == refused

    # an empty tokenizer folder is no tokenizer either; a folder where the template should be
    shutil.rmtree(tokenizer)
    tokenizer.mkdir()
    template.mkdir()
    refused = bridge_refusals(assess_sparkinfer(cfg, reports=probe(cfg)).refusals)
    assert len(refused) == 2
    assert f"has no tokenizer folder (K3_TOKENIZER_DIR) at {tokenizer}: it is empty" in refused[0]
    assert f"at {template}: it is a folder, not a file" in refused[1]
    assert FETCH_TOKENIZER in refused[0]
    assert f"--local-dir {tokenizer} --include" in refused[0]
    assert FETCH_TEMPLATE in refused[1]


def test_custom_paths_are_checked_and_a_path_the_probe_did_not_see_is_a_warning(
    sshd: SshServer, tmp_path: Path
) -> None:
    ns = nodes(sshd, "custom-")
    tokenizer, template = write_model_extras(tmp_path / "elsewhere" / "model")
    cfg = SparkInferConfig(
        Cluster("cp", ns), tokenizer_dir=str(tokenizer), chat_template=str(template)
    )
    reports = probe(cfg)
    assert bridge_refusals(assess_sparkinfer(cfg, reports=reports).refusals) == []
    # the default tokenizer folder is not there, and is not what this launch uses
    moved = SparkInferConfig(cfg.cluster, chat_template=str(template))
    refused = bridge_refusals(assess_sparkinfer(moved, reports=probe(moved)).refusals)
    assert len(refused) == 1
    default = Path(ns[0].model_path).parent / "tokenizer"
    assert f"at {default}: there is nothing there" in refused[0]
    assert "set where it is" in refused[0]

    # a path chosen after the probe ran is not refused on a guess: a warning asks to probe again
    later = SparkInferConfig(cfg.cluster, tokenizer_dir="/opt/k3/tok", chat_template=str(template))
    a = assess_sparkinfer(later, reports=reports)
    assert bridge_refusals(a.refusals) == []
    assert (
        f"Rank 0 ({ns[0].label}): the last probe did not look for the tokenizer folder "
        "/opt/k3/tok; probe again to check it is there."
    ) in a.warnings
    # an unreachable rank 0 is refused for that, not for files nobody could look at
    down = (replace(ns[0], port=1), *ns[1:])
    gone = SparkInferConfig(Cluster("down", down))
    reports = probe_cluster(
        gone.cluster,
        ClusterStore(default_paths()).known_hosts,
        rank0_paths=gone.bridge_paths,
        connect_timeout=3,
    )
    a = assess_sparkinfer(gone, reports=reports)
    assert bridge_refusals(a.refusals) == []
    assert any("cannot be probed" in r for r in a.refusals)
