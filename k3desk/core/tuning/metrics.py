"""The speeds a running llama-server measures itself, read from its ``/metrics``.

llama-server started with ``--metrics`` keeps Prometheus counters of the prompt
tokens it processed and the tokens it generated, with the time each took
(``server_task_result_metrics::to_metrics``, tools/server/server-task.cpp in
b11434): ``llamacpp:prompt_tokens_total``, ``prompt_seconds_total``,
``tokens_predicted_total``, ``tokens_predicted_seconds_total``.  The difference
between two readings is what the requests in between measured: prompt tok/s and
decode tok/s of real answers, whichever client asked.  ``/metrics`` needs the
API key (it is not one of the public endpoints, server-http.cpp).

:class:`SpeedWatcher` reads the counters every few seconds in a thread of its
own and reports each new stretch of answers.  Watching an engine k3desk started
(``pid``), every reading goes through :func:`k3desk.core.engines.identity.keyed_get`:
the key is sent only over a connection that process accepted, and the watcher ends
when the process does (after a restart the new engine gets a watcher of its own).
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

METRICS_FLAG = "--metrics"
# an answer shorter than this says little about the decode speed
MIN_DECODE_TOKENS = 8
MIN_PROMPT_TOKENS = 16


@dataclass(frozen=True)
class Counters:
    prompt_tokens: float
    prompt_seconds: float
    predicted_tokens: float
    predicted_seconds: float


@dataclass(frozen=True)
class MeasuredSpeed:
    """What the answers between two readings of the counters measured."""

    prompt_tps: float  # 0 when too few prompt tokens were processed to say
    decode_tps: float  # 0 when too few tokens were generated to say
    prompt_tokens: int
    decode_tokens: int

    @property
    def useful(self) -> bool:
        return self.prompt_tps > 0 or self.decode_tps > 0


_NAMES = {
    "llamacpp:prompt_tokens_total": "prompt_tokens",
    "llamacpp:prompt_seconds_total": "prompt_seconds",
    "llamacpp:tokens_predicted_total": "predicted_tokens",
    "llamacpp:tokens_predicted_seconds_total": "predicted_seconds",
}


def parse_metrics(text: str) -> Counters | None:
    """The four counters from a Prometheus text page, or None if one is missing."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 2 or parts[0] not in _NAMES:
            continue
        try:
            value = float(parts[1])
        except ValueError:
            return None
        if value != value or value < 0:  # NaN or negative: not a counter
            return None
        found[_NAMES[parts[0]]] = value
    if len(found) != len(_NAMES):
        return None
    return Counters(**found)


def speed_between(before: Counters, after: Counters) -> MeasuredSpeed | None:
    """The speeds of the requests between two readings (None: nothing new, or a
    restarted server whose counters went back)."""
    dp = after.prompt_tokens - before.prompt_tokens
    dps = after.prompt_seconds - before.prompt_seconds
    dg = after.predicted_tokens - before.predicted_tokens
    dgs = after.predicted_seconds - before.predicted_seconds
    if min(dp, dps, dg, dgs) < 0:
        return None
    if dp <= 0 and dg <= 0:
        return None
    prompt = dp / dps if dp >= MIN_PROMPT_TOKENS and dps > 0 else 0.0
    decode = dg / dgs if dg >= MIN_DECODE_TOKENS and dgs > 0 else 0.0
    return MeasuredSpeed(prompt, decode, round(dp), round(dg))


def _went_back(a: Counters, b: Counters) -> bool:
    return (
        b.prompt_tokens < a.prompt_tokens
        or b.predicted_tokens < a.predicted_tokens
        or b.prompt_seconds < a.prompt_seconds
        or b.predicted_seconds < a.predicted_seconds
    )


def fetch_owned_counters(pid: int, url: str, api_key: str, timeout: float = 2.0) -> Counters | None:
    """:func:`fetch_counters` from the engine process ``pid`` only (see the module)."""
    from k3desk.core.engines.identity import keyed_get

    port = urlsplit(url).port
    if port is None:
        return None
    got = keyed_get(pid, port, "/metrics", api_key, timeout=timeout)
    if got is None or got[0] != 200:
        return None
    return parse_metrics(got[1].decode("utf-8", "replace"))


def fetch_counters(url: str, api_key: str, timeout: float = 2.0) -> Counters | None:
    """Read ``url``'s ``/metrics`` (None if it does not answer with the counters:
    not llama-server, started without ``--metrics``, or busy beyond ``timeout``)."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return None
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {api_key}"})
        resp = conn.getresponse()
        body = resp.read(1 << 20).decode("utf-8", "replace")
        if resp.status != 200:
            return None
        return parse_metrics(body)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


class SpeedWatcher:
    """Poll a server's counters and call ``on_speed`` for every stretch of new answers.

    A stretch ends when the counters stop moving between two readings, so one long
    answer is reported once, when it is done.  ``fresh``: the server was just started
    (its counters are zero); else the first reading is the baseline.  ``stop`` ends
    the thread.
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        on_speed: Callable[[MeasuredSpeed], None],
        *,
        interval: float = 2.0,
        fetch: Callable[[str, str], Counters | None] = fetch_counters,
        fresh: bool = True,
        pid: int | None = None,
    ) -> None:
        self._url = url
        self._key = api_key
        self._on_speed = on_speed
        self._interval = interval
        self._pid = pid
        if pid is not None and fetch is fetch_counters:
            fetch = lambda u, k: fetch_owned_counters(pid, u, k)  # noqa: E731
        self._fetch = fetch
        # a server that has just started has counted nothing: start from zero, so the
        # first answer counts even when /metrics was too busy to answer before it ended
        self._base: Counters | None = Counters(0.0, 0.0, 0.0, 0.0) if fresh else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="speed-watcher", daemon=True)

    def start(self) -> SpeedWatcher:
        self._thread.start()
        return self

    def stop(self, wait: bool = True) -> None:
        """End the polling; with ``wait``, until the thread is gone (a reading in
        flight takes up to its 2 s timeout)."""
        self._stop.set()
        if wait and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self._interval + 3.0)

    def poll_once(
        self, base: Counters | None, last: Counters | None
    ) -> tuple[Counters | None, Counters | None]:
        """One reading: returns the new (base, last); reports a finished stretch."""
        now = self._fetch(self._url, self._key)
        if now is None:
            return base, last
        if base is None or _went_back(base, now):
            return now, now  # the first reading, or a restarted server: start from here
        if now == last and now != base:  # moved since base, quiet since last: done
            speed = speed_between(base, now)
            if speed is not None and speed.useful:
                self._on_speed(speed)
            return now, now
        return base, now

    def initial(self) -> tuple[Counters | None, Counters | None]:
        """The (base, last) the polling starts from."""
        return self._base, self._base

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        from k3desk.core.engines.identity import alive_pid

        base, last = self.initial()
        while not self._stop.is_set():
            if self._pid is not None and not alive_pid(self._pid):
                return  # the engine it watched is gone: so is the watcher
            base, last = self.poll_once(base, last)
            self._stop.wait(self._interval)
