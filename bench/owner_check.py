"""The check before every keyed request to k3desk's own engine: proven once, then quick.

    python bench/owner_check.py [--processes 300] [--rounds 200]

Before each chat request to the engine k3desk started, k3desk makes sure the process
listening on the port is still that engine (the key is never sent to another program).
The full check lists every socket of every process (psutil.net_connections), so its cost
grows with what else runs: a desktop has hundreds of processes.  Once a check passes,
k3desk keeps the listening socket as its proof, and the next checks ask the kernel for
the port's listeners (netlink) and the engine's own open files only.

Here a listener stands for the engine, ``--processes`` idle processes stand for the rest
of a desktop, and both checks run alternately on the same port.  The anchor is the full
check; the last line prints ``quick/full = X`` (goal <= 0.1).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from k3desk.core.engines import identity

ENGINE = (
    "import socket, sys\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(s.getsockname()[1], flush=True); sys.stdin.read()\n"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    others = [subprocess.Popen(["sleep", "3600"]) for _ in range(a.processes)]
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert engine.stdout is not None
        port = int(engine.stdout.readline())
        full: list[float] = []
        quick: list[float] = []
        for _ in range(a.rounds):
            identity._proofs.clear()  # the full check, as on the first request
            t0 = time.perf_counter()
            assert identity.owner_problem(engine.pid, port) == ""
            t1 = time.perf_counter()
            assert identity.owner_problem(engine.pid, port) == ""  # proven: quick
            t2 = time.perf_counter()
            full.append(t1 - t0)
            quick.append(t2 - t1)
    finally:
        engine.kill()
        engine.communicate()
        for p in others:
            p.kill()
            p.wait()
    f, q = statistics.median(full), statistics.median(quick)
    print(f"{a.processes} other processes, {a.rounds} rounds: full check {f * 1e3:.2f} ms, "
          f"proven {q * 1e3:.3f} ms (median)")  # fmt: skip
    print(f"quick/full = {q / f:.4f}")
    return 0 if q / f <= 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
