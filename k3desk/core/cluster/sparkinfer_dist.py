"""Every rank runs the same SparkInfer build: the binary and its libraries, by SHA-256.

The recipe's launcher copies one ``dist/`` folder (``kimi_k3_dist_generate``,
``libsparkinfer_runtime.so``, ``libsparkinfer_moe.so``) to every peer, after writing its
``SHA256SUMS`` (vcruz305/kimi-k3-neuron-tp3-dgxspark-recipe ``scripts/k3_cluster.sh``,
``write_manifest``, lines 108-116), and checks the sums on each peer (line 209) before it
starts anything; its README says "do not mix binary or DSO hashes".  Ranks of different
builds agree on the bootstrap and then compute different things (or hang in NCCL).

k3desk does not copy the engine (each node has its own, where ``sparkinfer=`` says), so
before the first start it asks every node for the SHA-256 of its binary (a bare name is
found on the node's PATH, as the start would find it) and of the ``libsparkinfer_*.so*``
beside it, and refuses a launch whose ranks differ, naming the file and the nodes.  The
folder it found is also what the launch puts before ``LD_LIBRARY_PATH`` (k3_cluster.sh:131).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from k3desk.core.cluster.group import LaunchFailure
from k3desk.core.cluster.nodes import ClusterError, Node
from k3desk.core.cluster.ssh import SshClient
from k3desk.core.progress import CancelToken

MARK = "@@k3desk-dist "
# $1: the workdir (where the engine starts), $2: the binary as configured
SCRIPT = r"""
cd -- "$1" 2>/dev/null
b=$2
case $b in
  */*) ;;
  *) b=$(command -v -- "$b") || { echo "@@k3desk-dist missing"; exit 0; } ;;
esac
[ -f "$b" ] || { echo "@@k3desk-dist missing"; exit 0; }
real=$(readlink -f -- "$b" 2>/dev/null) || real=$b
d=$(dirname -- "$real")
h() { sha256sum < "$1" 2>/dev/null | cut -c1-64; }
echo "@@k3desk-dist dir $d"
echo "@@k3desk-dist file $(h "$real") $(basename -- "$real")"
for f in "$d"/libsparkinfer_*.so*; do
  [ -f "$f" ] && echo "@@k3desk-dist file $(h "$f") $(basename -- "$f")"
done
exit 0
"""


@dataclass(frozen=True)
class NodeDist:
    """What one node runs: the binary's folder and {file name: SHA-256}."""

    node: Node
    binary: str  # as configured
    folder: str = ""  # "" when the binary was not found
    files: dict[str, str] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return bool(self.folder)


def parse_dist(node: Node, binary: str, stdout: str) -> NodeDist:
    folder = ""
    files: dict[str, str] = {}
    for line in stdout.splitlines():
        if not line.startswith(MARK):
            continue
        kind, _, rest = line[len(MARK) :].partition(" ")
        if kind == "dir":
            folder = rest
        elif kind == "file":
            digest, _, name = rest.partition(" ")
            files[name] = digest
    return NodeDist(node, binary, folder, files)


def dist_command(node: Node, binary: str) -> str:
    return shlex.join(["sh", "-c", SCRIPT, "k3desk-dist", node.workdir or ".", binary])


def compare(dists: Sequence[NodeDist]) -> list[str]:
    """Why these ranks do not run one build (rank 0 is the reference); [] when they do."""
    out: list[str] = []
    for rank, d in enumerate(dists):
        if not d.found:
            out.append(f"rank {rank} on {d.node.label}: {d.binary} was not found on the node")
    if out or not dists:
        return out
    ref = dists[0]
    names = sorted({n for d in dists for n in d.files})
    for name in names:
        for rank, d in enumerate(dists[1:], start=1):
            mine, theirs = ref.files.get(name), d.files.get(name)
            if mine == theirs:
                continue
            if theirs is None:
                out.append(f"{name} is beside the binary on rank 0 ({ref.node.label}) but not "
                           f"on rank {rank} ({d.node.label})")  # fmt: skip
            elif mine is None:
                out.append(f"{name} is beside the binary on rank {rank} ({d.node.label}) but "
                           f"not on rank 0 ({ref.node.label})")  # fmt: skip
            else:
                out.append(f"{name} differs: sha256 {mine[:12]}… on rank 0 ({ref.node.label}), "
                           f"{theirs[:12]}… on rank {rank} ({d.node.label})")  # fmt: skip
    return out


Runner = Callable[[Node, str], str]  # (node, command) -> stdout


def check_dist(
    nodes: Sequence[Node], binaries: Sequence[str], run: Runner
) -> list[NodeDist]:
    """Each rank's build, or a fatal :class:`LaunchFailure` when they differ."""
    dists = [
        parse_dist(node, binary, run(node, dist_command(node, binary)))
        for node, binary in zip(nodes, binaries, strict=True)
    ]
    problems = compare(dists)
    if not problems:
        return dists
    missing = [d for d in dists if not d.found]
    if missing:
        who = missing[0].node.label
        raise LaunchFailure(
            "; ".join(problems),
            f"Install kimi_k3_dist_generate on {who} or set sparkinfer=PATH for that node.",
            fatal=True,
        )
    raise LaunchFailure(
        "The ranks do not run the same SparkInfer build: " + "; ".join(problems) + ".",
        "Copy rank 0's binary and its libsparkinfer_*.so to the others (the recipe's "
        "`k3_cluster.sh sync` copies one dist/ folder and checks its SHA256SUMS on every "
        "node), or point sparkinfer= at the same build on every node.",
        fatal=True,
    )


def ssh_runner(
    client_for: Callable[[Node], SshClient], timeout: float, cancel: CancelToken | None
) -> Runner:
    """A :data:`Runner` over each node's :class:`SshClient` (ssh's own failures raise)."""

    def run(node: Node, command: str) -> str:
        result = client_for(node).run(command, timeout=timeout, cancel=cancel)
        if MARK not in result.text:
            last = (result.error_text.strip().splitlines() or ["no output"])[-1]
            raise ClusterError(f"{node.label}: the check of the SparkInfer build failed: {last}")
        return result.text

    return run
