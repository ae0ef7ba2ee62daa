"""Named operations: each user action says what it changed, computed from what it did
(an add that added nothing changed nothing; a refusal changes nothing and does not stop
the other paths), and a cancelled operation never runs its work."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3desk.core.app import actions
from k3desk.core.app.library import library
from k3desk.core.app.operations import NO_CHANGES, Change, OpChanges, Operation
from k3desk.core.app.services import Services
from k3desk.core.errors import Cancelled
from k3desk.devtools.tinyk3 import TinyModel


@pytest.fixture
def services(k3_home: Path) -> Services:
    return Services()


def test_changes_say_which_kinds_changed() -> None:
    both = OpChanges.of(Change.MODELS) | OpChanges.of(Change.TOKEN)
    assert both.touches(Change.TOKEN)
    assert both.touches(Change.ENGINE, Change.MODELS)
    assert not both.touches(Change.ENGINE, Change.SETTINGS)
    assert str(both) == "models, token"
    assert not NO_CHANGES
    assert str(NO_CHANGES) == "nothing"
    assert not NO_CHANGES.touches(*Change)


def test_adding_models_changes_them_once_and_a_refusal_changes_nothing(
    services: Services, tiny_k3: TinyModel, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.gguf"
    out, changes = actions.add_models(services, [missing, tiny_k3.parts[1]]).run()
    assert [a.added[0].shard for a in out.added] == [tiny_k3.first_part]
    (refusal,) = out.failed
    assert "does not exist" in refusal.message
    assert changes == OpChanges.of(Change.MODELS)
    assert library(services).load() == [tiny_k3.first_part]

    again, changes = actions.add_models(services, [tiny_k3.first_part]).run()
    assert again.added[0].already
    assert changes == NO_CHANGES  # the list is the same one: no page needs to refresh

    refused, changes = actions.add_models(services, [missing]).run()
    assert not refused.added
    assert refused.failed
    assert changes == NO_CHANGES

    removed, changes = actions.remove_model(services, again.added[0].added[0].id).run()
    assert removed == tiny_k3.first_part
    assert changes.touches(Change.MODELS)
    assert library(services).load() == []


def test_a_cancelled_operation_never_runs_its_work() -> None:
    ran: list[int] = []
    op = Operation("count", lambda _t: ran.append(1), OpChanges.of(Change.CHATS))
    op.cancel()
    assert op.cancelled
    with pytest.raises(Cancelled):
        op.run()
    assert ran == []


def test_the_work_sees_the_operations_own_token() -> None:
    op: Operation[bool] = Operation("watch", lambda token: token is op.token)
    result, changes = op.run()
    assert result is True
    assert changes == NO_CHANGES
