"""The switch question says what becomes of the open conversation's pictures when the
model loaded for it has no vision: kept in the conversation, not sent."""

from __future__ import annotations

from k3desk.core.app.model_switch import switch_question


def test_the_question_says_pictures_stay_but_are_not_sent_to_a_model_without_vision() -> None:
    _text, one = switch_question("K3 IQ1_S", "K3 Small", True, None, pictures=1)
    assert one.endswith(
        "Continued, the conversation keeps its picture, but K3 Small has no vision and is "
        "not sent it."
    )
    _text, three = switch_question("K3 IQ1_S", "K3 Small", True, None, pictures=3)
    assert "keeps its 3 pictures, but K3 Small has no vision and is not sent them." in three
    _text, none = switch_question("K3 IQ1_S", "K3 Small", True, None)
    assert "vision" not in none
