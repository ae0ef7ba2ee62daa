"""Clusters: a name and the machines (nodes) k3desk reaches over SSH.

A cluster is stored in ``<config>/clusters.json``.  Nothing secret is kept:
SSH authenticates with the user's agent or key files (an identity file is
remembered by path only) and never with a password.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from k3desk.core.errors import K3Error
from k3desk.core.paths import AppPaths
from k3desk.core.private import write_private
from k3desk.core.safepaths import display_name

CLUSTERS_SCHEMA = 1
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HOST_RE = re.compile(r"[A-Za-z0-9._:%\[\]-]+")
_USER_RE = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,63}")
_GPU_RE = re.compile(r"[0-9]{1,3}|GPU-[0-9A-Fa-f-]{8,64}|MIG-[0-9A-Fa-f/-]{8,80}")


class ClusterError(K3Error):
    """A cluster or node is malformed, unknown, or cannot be reached."""


def is_ipv4_literal(text: str) -> bool:
    """True for a dotted-quad IPv4 address such as ``10.0.0.2`` (no names, no IPv6)."""
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Node:
    """One machine of a cluster, as k3desk reaches it with ``ssh``."""

    host: str  # what ssh connects to: a name or an address
    user: str = ""  # "" = ssh's own default (the local user name or ~/.ssh/config)
    port: int = 22
    identity: str = ""  # private key file; "" = the ssh agent and ssh's default keys
    # Address the engines use between nodes and that this machine connects to
    # (SparkInfer needs an IPv4 literal); "" = ``host``.
    address: str = ""
    model_path: str = ""  # folder on the node that holds the tier's shard files
    workdir: str = ""  # folder on the node for engine logs and tools; "" = the login folder
    name: str = ""  # label shown to people; "" = ``host`` (with ``:port`` if not 22)
    k3desk: str = "k3desk"  # command that runs k3desk on the node, if installed
    python: str = "python3"  # interpreter for the self-contained probe
    sparkinfer_bin: str = "kimi_k3_dist_generate"  # SparkInfer's binary on the node
    rpc_server_bin: str = ""  # llama.cpp's RPC worker; "" = rpc-server or ggml-rpc-server
    # SparkInfer: the GPU this node's rank runs on (its CUDA_VISIBLE_DEVICES: an index or a
    # GPU-UUID); "" = GPU 0, or 0, 1, 2, 3 in rank order for ranks sharing an engine address
    # (one PC), as the recipe's k3_cluster.sh chooses (role_gpu)
    gpu: str = ""

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return self.host if self.port == 22 else f"{self.host}:{self.port}"

    @property
    def destination(self) -> str:
        """``user@host`` (or ``host``) as ssh takes it."""
        return f"{self.user}@{self.host}" if self.user else self.host

    @property
    def engine_address(self) -> str:
        return self.address or self.host

    def problems(self) -> list[str]:
        """What is wrong with this node's description (empty when it is fine)."""
        out: list[str] = []
        who = f"node {self.label!r}"
        if not self.host or not _HOST_RE.fullmatch(self.host):
            out.append(f"{who}: host {self.host!r} is not a host name or address")
        elif "[" in self.host or "]" in self.host:  # parse_node_spec strips an IPv6's brackets
            out.append(
                f"{who}: host {self.host!r} is not a host name or address "
                "(an IPv6 address goes in a closed pair of brackets: [fd00::2]:22)"
            )
        if self.user and not _USER_RE.fullmatch(self.user):
            out.append(f"{who}: user {self.user!r} is not a valid user name")
        if (
            isinstance(self.port, bool)
            or not isinstance(self.port, int)
            or not (1 <= self.port <= 65535)
        ):
            out.append(f"{who}: ssh port {self.port!r} must be between 1 and 65535")
        if self.address and not _HOST_RE.fullmatch(self.address):
            out.append(f"{who}: address {self.address!r} is not a host name or address")
        if self.gpu and not _GPU_RE.fullmatch(self.gpu):
            out.append(
                f"{who}: gpu {self.gpu!r} is not a GPU index (0, 1, ...) or UUID (GPU-...)"
            )
        if self.name and not _NAME_RE.fullmatch(self.name):
            out.append(f"{who}: name {self.name!r} may use only letters, digits, '.', '_' and '-'")
        for attr in ("model_path", "workdir", "identity"):
            value = getattr(self, attr)
            if "\n" in value or "\0" in value:
                out.append(f"{who}: {attr} contains a line break")
            elif display_name(value) != value:  # escape sequences, undecodable bytes
                out.append(f"{who}: {attr} contains control characters or undecodable bytes")
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        defaults = asdict(Node(host=self.host))
        # keep the file short: only what differs from the defaults (plus host)
        return {k: v for k, v in d.items() if k == "host" or v != defaults[k]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "") -> Node:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ClusterError(
                f"Unknown node field(s) {', '.join(unknown)}{where}.",
                f"Known fields: {', '.join(sorted(known))}.",
            )
        if "host" not in d:
            raise ClusterError(f"A node has no host{where}.")
        try:
            node = cls(**{k: v for k, v in d.items()})
        except TypeError as exc:
            raise ClusterError(f"A node is malformed{where}: {exc}") from exc
        for attr in (f for f in known if f != "port"):
            if not isinstance(getattr(node, attr), str):
                raise ClusterError(f"Node field {attr} must be text{where}.")
        return node


def parse_node_spec(spec: str, **defaults: Any) -> Node:
    """``[user@]host[:port][,key=value...]`` -> :class:`Node`.

    Keys: ``address``, ``identity``, ``model``/``model_path``, ``workdir``, ``name``,
    ``k3desk``, ``python``, ``sparkinfer``, ``rpc``, ``gpu``.  ``defaults`` fill what the
    spec leaves out.  IPv6 hosts go in brackets: ``[fd00::2]:22``.
    """
    head, *opts = [part.strip() for part in spec.split(",")]
    if not head:
        raise ClusterError(f"Node {spec!r} names no host.", "Write it as [user@]host[:port].")
    user = ""
    if "@" in head:
        user, head = head.split("@", 1)
    port = defaults.pop("port", 22)
    host = head
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", head)
    if m:
        host, port = m.group(1), int(m.group(2)) if m.group(2) else port
    elif head.count(":") == 1:
        host, p = head.split(":")
        if not p.isdigit():
            raise ClusterError(f"Node {spec!r}: port {p!r} is not a number.")
        port = int(p)
    aliases = {
        "model": "model_path",
        "sparkinfer": "sparkinfer_bin",
        "rpc": "rpc_server_bin",
        "rpc_server": "rpc_server_bin",
    }
    fields: dict[str, Any] = {k: v for k, v in defaults.items() if v not in (None, "")}
    for opt in opts:
        if not opt:
            continue
        if "=" not in opt:
            raise ClusterError(
                f"Node {spec!r}: option {opt!r} is not key=value.",
                "Example: alice@spark1,address=10.0.0.11,model=/data/k3",
            )
        key, value = (s.strip() for s in opt.split("=", 1))
        key = aliases.get(key, key)
        if key not in Node.__dataclass_fields__ or key in ("host", "user", "port"):
            raise ClusterError(
                f"Node {spec!r}: unknown option {key!r}.",
                "Options: address, identity, model, workdir, name, k3desk, python, "
                "sparkinfer, rpc, gpu.",
            )
        fields[key] = value
    node = Node(
        host=host,
        user=user or str(defaults.get("user") or ""),
        port=port,
        **{k: v for k, v in fields.items() if k != "user"},
    )
    problems = node.problems()
    if problems:
        raise ClusterError("; ".join(problems) + ".")
    return node


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]
    note: str = ""
    created: str = field(default="", compare=False)

    def problems(self) -> list[str]:
        out: list[str] = []
        if not _NAME_RE.fullmatch(self.name):
            out.append(
                f"cluster name {self.name!r} may use only letters, digits, '.', '_' and '-' "
                "(up to 64, starting with a letter or digit)"
            )
        if not self.nodes:
            out.append(f"cluster {self.name!r} has no nodes")
        labels = [n.label for n in self.nodes]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            out.append(
                f"cluster {self.name!r} lists {', '.join(dupes)} more than once "
                "(give each node a distinct name=)"
            )
        for n in self.nodes:
            out.extend(n.problems())
        return out

    def node(self, label: str) -> Node:
        for n in self.nodes:
            if n.label == label:
                return n
        raise ClusterError(
            f"Cluster {self.name!r} has no node {label!r}.",
            f"Its nodes: {', '.join(n.label for n in self.nodes)}.",
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "nodes": [n.to_dict() for n in self.nodes]}
        if self.note:
            d["note"] = self.note
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "") -> Cluster:
        name = d.get("name")
        nodes = d.get("nodes")
        if not isinstance(name, str) or not isinstance(nodes, list):
            raise ClusterError(f"A cluster entry needs a name and a list of nodes{where}.")
        inner = f" (cluster {name!r}{where})"
        return cls(
            name=name,
            nodes=tuple(Node.from_dict(n, inner) for n in nodes if isinstance(n, dict)),
            note=str(d.get("note", "")),
        )


class ClusterStore:
    """Clusters saved under ``<config>/clusters.json`` (written atomically)."""

    def __init__(self, paths: AppPaths) -> None:
        self.paths = paths
        self.file = paths.config / "clusters.json"

    @property
    def known_hosts(self) -> Path:
        """k3desk's own known_hosts file (ssh adds new nodes to it: accept-new)."""
        return self.paths.config / "ssh_known_hosts"

    def load(self) -> list[Cluster]:
        if not self.file.exists():
            return []
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ClusterError(
                f"The cluster list {self.file} cannot be read: {exc}",
                "Fix or delete the file; `k3desk cluster add` writes a new one.",
            ) from exc
        if not isinstance(data, dict) or not isinstance(data.get("clusters"), list):
            raise ClusterError(
                f"The cluster list {self.file} does not hold a 'clusters' list.",
                "Fix or delete the file; `k3desk cluster add` writes a new one.",
            )
        where = f" in {self.file}"
        return [Cluster.from_dict(c, where) for c in data["clusters"] if isinstance(c, dict)]

    def save(self, clusters: Iterable[Cluster]) -> None:
        body = {"schema": CLUSTERS_SCHEMA, "clusters": [c.to_dict() for c in clusters]}
        write_private(self.file, json.dumps(body, indent=2) + "\n")

    def names(self) -> list[str]:
        return [c.name for c in self.load()]

    def get(self, name: str) -> Cluster:
        for c in self.load():
            if c.name == name:
                return c
        known = self.names()
        raise ClusterError(
            f"There is no cluster named {name!r}.",
            f"Known clusters: {', '.join(known)}."
            if known
            else "Add one with `k3desk cluster add NAME --node user@host ...`.",
        )

    def add(self, cluster: Cluster, *, replace_existing: bool = False) -> Cluster:
        problems = cluster.problems()
        if problems:
            raise ClusterError("; ".join(problems) + ".")
        clusters = self.load()
        if any(c.name == cluster.name for c in clusters):
            if not replace_existing:
                raise ClusterError(
                    f"A cluster named {cluster.name!r} already exists.",
                    "Remove it first, pick another name, or pass --replace.",
                )
            clusters = [cluster if c.name == cluster.name else c for c in clusters]
        else:
            clusters.append(cluster)
        self.save(clusters)
        return cluster

    def remove(self, name: str) -> Cluster:
        cluster = self.get(name)
        self.save(c for c in self.load() if c.name != name)
        return cluster

    def update_node(self, cluster_name: str, label: str, **changes: Any) -> Cluster:
        cluster = self.get(cluster_name)
        old = cluster.node(label)
        new_nodes = tuple(replace(n, **changes) if n is old else n for n in cluster.nodes)
        return self.add(replace(cluster, nodes=new_nodes), replace_existing=True)
