"""My models: sets added by path or found in the Settings folders, checked from their
headers, recognised as tiers by header facts, projectors paired by header, and judged in
the tiers table's words.  Bad input is refused with the reason and changes nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from k3desk.core.app.library import (
    LibraryError,
    add_model,
    library,
    list_models,
    local_models,
    remove_model,
)
from k3desk.core.app.services import Services
from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import TierRequest, judge_tiers
from k3desk.core.catalog.identify import identify_tier
from k3desk.core.gguf.validate import inspect_shard_set
from k3desk.core.settings import Settings, SettingsStore
from k3desk.devtools.tinyk3 import TinyModel

REPO = Path(__file__).resolve().parents[3]
H100 = REPO / "resources" / "hardware" / "8xH100-2TB.json"


@pytest.fixture
def services(k3_home: Path) -> Services:
    return Services()


def copy_set(model: TinyModel, dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    out = [Path(shutil.copy2(p, dest / p.name)) for p in model.parts]
    if model.mmproj is not None:
        shutil.copy2(model.mmproj, dest / model.mmproj.name)
    return out


def test_add_any_part_stores_part_one_pairs_the_projector_and_is_found_again(
    services: Services, tiny_k3: TinyModel
) -> None:
    result = add_model(services, tiny_k3.parts[2])  # the last part: the set is meant
    (m,) = result.added
    assert m.shard == tiny_k3.first_part
    assert m.parts == 3
    assert m.projector == tiny_k3.mmproj
    assert m.tier is None  # a tiny model is no catalog tier
    assert not result.already
    # found again by a new process's services (the list is on disk, private)
    again, _ = local_models(Services())
    assert [x.shard for x in again] == [tiny_k3.first_part]
    stored = library(services).path
    assert stored.stat().st_mode & 0o077 == 0
    # adding it again changes nothing
    assert add_model(services, tiny_k3.first_part).already
    assert len(library(services).load()) == 1


def test_bad_input_is_refused_with_the_reason_and_changes_nothing(
    services: Services, tiny_k3: TinyModel, tmp_path: Path
) -> None:
    add_model(services, tiny_k3.first_part)
    before = library(services).path.read_bytes()
    partial = tmp_path / "partial"
    parts = copy_set(tiny_k3, partial)
    parts[1].unlink()
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("just some text, not a model\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    unreadable = tmp_path / "locked"
    copy_set(tiny_k3, unreadable)[0].chmod(0)
    cases = {
        tmp_path / "nowhere": "does not exist",
        not_gguf: "not a GGUF file",
        parts[0]: "Part 00002-of-00003 of Tiny-K3-IQ1_S is missing",
        partial: "is missing",
        empty: "No GGUF model in",
        tiny_k3.mmproj: "is a vision projector, not a model",
    }
    if os.geteuid() != 0:  # root reads a 000 file all the same
        cases[unreadable / tiny_k3.first_part.name] = "cannot be"
    for path, words in cases.items():
        assert path is not None
        with pytest.raises(LibraryError) as err:
            add_model(services, path)
        assert words in err.value.message, (path, err.value.message)
        assert library(services).path.read_bytes() == before


def test_a_twin_renamed_is_still_its_tier_and_judged_as_the_tiers_table_judges_it(
    services: Services, twin_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    tier_id = "vcruz305-ud-iq1s"
    parts = twin_factory(tier_id)
    # the same files under names that say nothing about the tier
    renamed = tmp_path / "mine"
    renamed.mkdir()
    for i, p in enumerate(parts, 1):
        os.link(p, renamed / f"my-model-{i:05d}-of-{len(parts):05d}.gguf")
    (m,) = add_model(services, renamed).added
    assert m.tier is not None
    assert m.tier.tier.id == tier_id
    assert "9 parts" in m.tier.text()
    assert "IQ1_S" in m.tier.text()
    hw = services.load_hardware(H100)
    subject = Subject.hardware_file(H100, hw)
    (row,) = list_models(services, hw, subject).rows
    tiers = judge_tiers(TierRequest(hw, subject), services.catalog.tiers)
    tier_row = tiers.row(tier_id)
    assert tier_row is not None
    assert row.label == tier_row.label
    assert row.speed is not None
    assert tier_row.speed is not None
    assert row.speed.text() == tier_row.speed.text()


def test_header_facts_not_names_decide_the_tier(twin_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    services = Services()
    tiers = services.catalog.tiers
    # a tiny model named exactly like a tier's part 1 is not that tier
    grearl = services.catalog.get("grearl-iq1s")
    from k3desk.devtools.tinyk3 import write_tiny_k3

    name = Path(grearl.first_shard).name.removesuffix("-00001-of-00094.gguf")
    fake = write_tiny_k3(tmp_path / "fake", shards=1, name=name)
    assert identify_tier(inspect_shard_set(fake.first_part).layout, tiers) is None
    # two tiers of the same experts differ by their facts
    for tier_id in ("6block-iq1s-xs", "6block-iq1s-xxs-832e"):
        layout = inspect_shard_set(twin_factory(tier_id)[0]).layout
        match = identify_tier(layout, tiers)
        assert match is not None
        assert match.tier.id == tier_id


def test_settings_folders_are_scanned_and_a_folder_model_is_removed_there(
    services: Services, tiny_k3: TinyModel, tmp_path: Path
) -> None:
    folder = tmp_path / "models"
    copy_set(tiny_k3, folder / "tiny")
    SettingsStore(services.paths.settings_file).save(
        Settings(model_dirs=(str(folder), str(tmp_path / "gone")))
    )
    hw = services.load_hardware(H100)
    judged = list_models(services, hw, Subject.hardware_file(H100, hw))
    (row,) = judged.rows
    assert row.model.source == "folder"
    assert row.model.projector is not None
    assert row.model.projector.parent == folder / "tiny"
    assert row.runs
    assert any("gone" in p and "does not exist" in p for p in judged.problems)
    with pytest.raises(LibraryError) as err:
        remove_model(services, row.model.id)
    assert "Settings" in err.value.hint


def test_a_projector_is_paired_by_its_header_not_its_name(
    services: Services, tiny_k3: TinyModel, tmp_path: Path
) -> None:
    parts = copy_set(tiny_k3, tmp_path / "m")
    proj = tmp_path / "m" / tiny_k3.mmproj.name  # type: ignore[union-attr]
    # a file called mmproj that is a model, not a projector, is not paired
    proj.unlink()
    shutil.copy2(tiny_k3.parts[0], tmp_path / "m" / "mmproj-fake.gguf")
    (m,) = add_model(services, parts[0]).added
    assert m.projector is None


def test_a_downloaded_sets_projector_at_the_repositorys_top_is_paired(
    services: Services, tiny_k3: TinyModel, tmp_path: Path
) -> None:
    """A set downloaded from the Hub lands as the repository holds it: its parts in the
    set's folder (IQ1_S/), the projector at the top; My models pairs them.  Files from
    elsewhere keep the rule of part 1's own folder."""
    from k3desk.core.hub.state import meta_dir

    for where, downloaded in ((tmp_path / "hub-set", True), (tmp_path / "Downloads", False)):
        parts = copy_set(tiny_k3, where / "IQ1_S")
        top = where / tiny_k3.mmproj.name  # type: ignore[union-attr]
        (where / "IQ1_S" / top.name).rename(top)
        if downloaded:
            meta_dir(where).mkdir()  # the download's own record, as k3desk keeps it
        (m,) = add_model(services, parts[0]).added
        assert m.projector == (top if downloaded else None), where


def test_remove_by_id_or_path_keeps_the_files(services: Services, tiny_k3: TinyModel) -> None:
    (m,) = add_model(services, tiny_k3.first_part).added
    assert remove_model(services, m.id) == tiny_k3.first_part
    assert library(services).load() == []
    assert tiny_k3.first_part.is_file()
    add_model(services, tiny_k3.first_part)
    remove_model(services, str(tiny_k3.first_part))
    assert library(services).load() == []
    with pytest.raises(LibraryError, match="not in your models"):
        remove_model(services, "0123456789")


def test_a_broken_list_is_reported_not_a_traceback(services: Services) -> None:
    path = library(services).path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    with pytest.raises(LibraryError, match="cannot be read"):
        local_models(services)


def test_the_cli_adds_lists_and_removes(tiny_k3: TinyModel, k3_home: Path) -> None:
    def k3(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "k3desk", "models", *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )

    added = k3("add", str(tiny_k3.first_part.parent), "--json")
    assert added.returncode == 0, added.stderr
    (m,) = json.loads(added.stdout)["added"]
    listed = json.loads(k3("list", "--hardware", str(H100), "--json").stdout)
    (row,) = listed["models"]
    assert row["id"] == m["id"]
    assert row["vision"] is True
    assert row["verdict"]
    assert row["speed"].endswith("tok/s")
    assert listed["judged"]["kind"] == "file"
    bad = k3("add", str(k3_home / "missing.gguf"))
    assert bad.returncode == 1
    assert "does not exist" in bad.stderr
    assert "Traceback" not in bad.stderr
    gone = k3("remove", m["id"], "--json")
    assert gone.returncode == 0, gone.stderr
    assert json.loads(k3("list", "--hardware", str(H100), "--json").stdout)["models"] == []
