"""Speed figures measured in rounds (k3desk/devtools/measure.py), the way the speed
checks compare a kernel cost with the runs it predicts.

A machine shared with others moves under a measurement within minutes; a figure taken
at one moment and compared with another taken at another carries both moments.  So
every run is made once per round, round after round, and the median of the rounds is
kept; its spread says how far the rounds were apart.
"""

from __future__ import annotations

from k3desk.devtools.measure import BenchResult, in_rounds, merged, repetitions_per_round


def _result(test: str, tps: float, *samples: float) -> BenchResult:
    return BenchResult(test, tps, samples or (tps,), 0.1, 0.2)


def test_rounds_interleave_the_jobs_so_each_sees_the_whole_measurement() -> None:
    """Every job runs once per round, in the same order each round: a neighbour who
    comes for one round slows one run of every job, not all runs of one job."""
    order: list[str] = []
    speeds = {"a": iter([10.0, 30.0, 11.0]), "b": iter([20.0, 60.0, 21.0])}

    def job(key: str) -> BenchResult:
        order.append(key)
        return _result("tg32", next(speeds[key]))

    rounds: list[int] = []
    out = in_rounds({k: (lambda k=k: [job(k)]) for k in ("a", "b")}, 3, rounds.append)
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert rounds == [0, 1, 2]
    # the odd round (three times faster) does not move the median
    assert out["a"][0].median_tps == 11.0
    assert out["b"][0].median_tps == 21.0
    # the spread is the rounds', not the repetitions'
    assert out["a"][0].spread == (30.0 - 10.0) / 11.0


def test_one_round_keeps_the_repetitions_and_their_spread() -> None:
    run = [_result("pp128", 100.0, 95.0, 100.0, 110.0), _result("tg32", 20.0, 19.0, 20.0)]
    assert merged([run]) == run
    assert merged([run])[0].spread == (110.0 - 95.0) / 100.0


def test_each_test_of_a_run_is_merged_on_its_own() -> None:
    runs = [
        [_result("pp128", 100.0), _result("tg32", 20.0)],
        [_result("pp128", 120.0), _result("tg32", 10.0)],
        [_result("pp128", 110.0), _result("tg32", 30.0)],
    ]
    by = {r.test: r for r in merged(runs)}
    assert by["pp128"].median_tps == 110.0
    assert by["tg32"].median_tps == 20.0
    assert by["tg32"].samples == (20.0, 10.0, 30.0)


def test_rounds_take_about_as_many_repetitions_in_all() -> None:
    assert repetitions_per_round(5, 1) == 5
    assert repetitions_per_round(5, 3) == 3  # 9 in all: at least two per round, a few more
    assert repetitions_per_round(7, 3) == 4
    assert repetitions_per_round(3, 3) == 2
    assert repetitions_per_round(5, 10) == 2
