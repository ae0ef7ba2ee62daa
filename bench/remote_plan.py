"""Bytes and time to a plan for the 94-part set on the Hub stand-in, against the first part whole.

    python bench/remote_plan.py [DIR]

The sparse twin of GrEarl's 94-part IQ1_S tier (DIR, a temporary folder by default;
an existing twin there is reused) is served by the Hub stand-in (tests/hubserver.py)
on 127.0.0.1.  In one run:

* remote: ``plan_remote_set`` on the repo: list it, read every part's header by HTTP
  ranges into a header twin, check it and plan it for the 1xH200 hardware file
  (nothing cached: a fresh K3DESK_HOME);
* anchor: download part 1 whole over the same stand-in (huggingface_hub's session,
  streamed to a file), as a manager that judges a set from its first file must, then
  plan the set from the local files.

It prints the bytes each read, the times and their ratios, and whether the two plans
agree (verdict, --n-cpu-moe, memory per device, llama-server arguments but the path).
Goal: the remote plan reads under 1 % of part 1, and the plans are equal.  Loopback
has no latency and serves well over 1 GB/s, so the times favour the anchor; on a real
link the anchor's time grows with the part's 6 GB, the remote plan's with its round
trips.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TIER = "grearl-iq1s"
REPO_ID = "GrEarl/Kimi-K3-GGUF-IQ1_S"
GOAL_SHARE = 0.01


def facts(planned: Any) -> dict[str, Any]:
    data = planned.plan.to_dict()
    args = list(data.pop("server_args"))
    args[args.index("-m") + 1] = Path(args[args.index("-m") + 1]).name
    return {**data, "server_args": args, "label": planned.view.label}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="k3-remote-plan-"))
    twin_dir = args.dir or work / "twin"
    os.environ["K3DESK_HOME"] = str(work / "home")
    os.environ["HF_HOME"] = str(work / "hf")

    from huggingface_hub import get_session, hf_hub_url

    from k3desk.core.app.remote_plan import RemotePlanRequest, plan_remote_set
    from k3desk.core.app.services import Services
    from k3desk.core.app.shardplan import PlanRequest, plan_shard_set
    from k3desk.core.catalog.loader import load_catalog
    from k3desk.core.resources import resources_dir
    from k3desk.devtools.twin import write_twin
    from tests.hubserver import HubServer

    parts = sorted(twin_dir.glob("*-of-00094.gguf"))
    if len(parts) != 94:
        parts = write_twin(load_catalog(resources_dir() / "catalog.json").get(TIER), twin_dir)
    hw = REPO / "resources" / "hardware" / "1xH200-141GB.json"
    first = parts[0].stat().st_size
    with HubServer(page_size=1000) as hub:
        hub.add_repo(REPO_ID, {p.name: p for p in parts}, hash_content=False)
        services = Services()
        t0 = time.perf_counter()
        remote = plan_remote_set(
            services, RemotePlanRequest(REPO_ID, hardware_file=hw, endpoint=hub.endpoint, token="")
        )
        t_remote = time.perf_counter() - t0
        sent_remote = hub.bytes_sent()
        hub.reset_log()

        t0 = time.perf_counter()
        url = hf_hub_url(REPO_ID, parts[0].name, revision=remote.headers.revision,
                         endpoint=hub.endpoint)  # fmt: skip
        target = work / "part1.gguf"
        with get_session().stream("GET", url) as r, target.open("wb") as out:
            for chunk in r.iter_bytes(8 << 20):
                out.write(chunk)
        local = plan_shard_set(services, PlanRequest(parts[0], hardware_file=hw))
        t_anchor = time.perf_counter() - t0
        sent_anchor = hub.bytes_sent()
        target.unlink()

    same = facts(remote.planned) == facts(local)
    share = remote.headers.received / first
    print(f"set: {REPO_ID}, 94 parts, part 1 = {first:,} bytes")
    print(f"remote plan: {remote.headers.received:,} bytes received ({sent_remote:,} sent), "
          f"{remote.headers.requests} range requests, {t_remote:.2f} s")  # fmt: skip
    print(f"anchor (part 1 whole, then plan): {sent_anchor:,} bytes, {t_anchor:.2f} s")
    print(f"bytes ratio remote/anchor: {remote.headers.received / sent_anchor:.4f} "
          f"({100 * share:.2f} % of part 1; goal < {100 * GOAL_SHARE:.0f} %)")  # fmt: skip
    print(f"time ratio remote/anchor: {t_remote / t_anchor:.3f}")
    print(f"plans equal: {same} (verdict {remote.planned.view.label!r}, "
          f"--n-cpu-moe {remote.planned.plan.n_cpu_moe})")  # fmt: skip
    ok = same and share < GOAL_SHARE
    print("goal met" if ok else "GOAL MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
