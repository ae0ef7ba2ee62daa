"""Reading what llama-server measures of its own answers (``/metrics``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from k3desk.core.engines.supervisor import LaunchSpec, Supervisor
from k3desk.core.paths import default_paths
from k3desk.core.tuning.metrics import (
    METRICS_FLAG,
    Counters,
    MeasuredSpeed,
    SpeedWatcher,
    fetch_counters,
    parse_metrics,
    speed_between,
)
from k3desk.devtools.tinyk3 import TinyModel

PAGE = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
llamacpp:prompt_seconds_total 2.5
llamacpp:tokens_predicted_total 64
llamacpp:tokens_predicted_seconds_total 4
llamacpp:prompt_tokens_seconds 48
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3
"""


def test_the_four_counters_are_read_and_nothing_else_is_needed() -> None:
    c = parse_metrics(PAGE)
    assert c == Counters(120, 2.5, 64, 4)
    assert parse_metrics(PAGE.replace("llamacpp:prompt_seconds_total 2.5\n", "")) is None
    assert parse_metrics(PAGE.replace(" 2.5", " nan")) is None
    assert parse_metrics("<html>502</html>") is None


def test_a_stretch_of_answers_gives_its_own_speeds() -> None:
    a = Counters(100, 2.0, 50, 5.0)
    b = Counters(300, 4.0, 150, 10.0)
    s = speed_between(a, b)
    assert s == MeasuredSpeed(prompt_tps=100.0, decode_tps=20.0, prompt_tokens=200,
                              decode_tokens=100)  # fmt: skip
    assert speed_between(a, a) is None
    assert speed_between(b, a) is None  # a restarted server's counters start again
    few = speed_between(a, Counters(104, 2.1, 53, 5.2))  # too short to say anything
    assert few is not None
    assert not few.useful


def test_the_watcher_reports_each_answer_once_when_it_is_done() -> None:
    readings: list[Counters | None] = [
        Counters(0, 0, 0, 0),
        None,  # busy: no answer within the timeout
        Counters(100, 1, 10, 0.5),  # an answer under way
        Counters(100, 1, 40, 2.0),
        Counters(100, 1, 40, 2.0),  # quiet again: done
        Counters(100, 1, 40, 2.0),
        Counters(0, 0, 0, 0),  # restarted
        Counters(50, 0.5, 20, 1.0),
        Counters(50, 0.5, 20, 1.0),
    ]
    seen: list[MeasuredSpeed] = []
    it = iter(readings)
    w = SpeedWatcher("http://127.0.0.1:1", "k", seen.append, fetch=lambda _u, _k: next(it))
    base = last = None
    for _ in readings:
        base, last = w.poll_once(base, last)
    assert seen == [MeasuredSpeed(100.0, 20.0, 100, 40), MeasuredSpeed(100.0, 20.0, 50, 20)]


def test_a_fresh_servers_first_answer_counts_even_if_metrics_was_busy_until_it_ended() -> None:
    # on a loaded machine /metrics may not answer while the first answer runs
    readings = iter([None, None, Counters(64, 0.8, 16, 2.0), Counters(64, 0.8, 16, 2.0)])
    seen: list[MeasuredSpeed] = []
    w = SpeedWatcher("http://127.0.0.1:1", "k", seen.append, fetch=lambda _u, _k: next(readings))
    state = w.initial()
    for _ in range(4):
        state = w.poll_once(*state)
    assert seen == [MeasuredSpeed(80.0, 8.0, 64, 16)]
    # attached to a server that has answered before: its first reading is the baseline
    readings = iter([Counters(64, 0.8, 16, 2.0), Counters(64, 0.8, 16, 2.0)])
    old = SpeedWatcher("http://127.0.0.1:1", "k", seen.append, fresh=False,
                       fetch=lambda _u, _k: next(readings))  # fmt: skip
    state = old.initial()
    for _ in range(2):
        state = old.poll_once(*state)
    assert len(seen) == 1


@pytest.mark.engine
def test_the_real_server_counts_what_its_answers_report(
    llama_server: Path, tiny_k3_single: TinyModel, supervised: list[Supervisor]
) -> None:
    args = ("-m", str(tiny_k3_single.first_part), "-c", "512", "-t", "1", METRICS_FLAG)
    sup = Supervisor(LaunchSpec(llama_server, args), default_paths().ensure())
    supervised.append(sup)
    sup.start()
    ep = sup.wait_ready(timeout=60)
    assert fetch_counters(ep.url, "wrong key") is None  # /metrics needs the key
    before = fetch_counters(ep.url, ep.api_key)
    assert before is not None
    r = httpx.post(
        f"{ep.url}/completion",
        headers=ep.headers,
        json={"prompt": list(range(1, 101)), "n_predict": 24, "ignore_eos": True,
              "cache_prompt": False},
        timeout=60,
    )
    r.raise_for_status()
    t = r.json()["timings"]
    after = fetch_counters(ep.url, ep.api_key)
    assert after is not None
    s = speed_between(before, after)
    assert s is not None
    assert s.prompt_tokens == t["prompt_n"] == 100
    assert s.decode_tokens == t["predicted_n"]
    # the counters and the answer's timings are kept apart in server-context.cpp (the
    # first token's sampling falls on different sides): the same speed within a few %
    assert s.decode_tps == pytest.approx(t["predicted_per_second"], rel=0.1)
    assert s.prompt_tps == pytest.approx(t["prompt_per_second"], rel=0.1)
