"""The command lines of the llama.cpp programs k3desk starts, built in one place.

Every flag k3desk writes or looks for is declared here once, with the aliases llama.cpp
b11434 gives it: llama-server's in ``common/arg.cpp`` (``common_params_parser_init``,
one ``common_arg({...names...})`` per option), rpc-server's in
``tools/rpc/rpc-server.cpp`` (``rpc_server_params_parse``).  The first name of a
:class:`Flag` is the one k3desk writes; the others are what a person may type among
the extra arguments (``-ncmoe 60`` is ``--n-cpu-moe 60``).

The builders below are the only code that puts an argv together:

* :func:`server_args`: llama-server for a launch plan, from the placement the planner
  chose (:class:`Offload`) and the options with the tuned settings already in them
  (threads, batch sizes: :class:`PlanOptions`);
* :func:`endpoint_args`: where it listens and the key it takes (the supervisor);
* :func:`bump_n_cpu_moe` and :func:`with_no_repack`: the re-plans after a crash;
* :func:`engine_defaults_args`, :func:`canary_args`: the tuner's reference and the
  probe's test load;
* :func:`rpc_server_args` and :func:`rpc_worker_args`: a cluster's llama-server with
  ``--rpc`` and its rpc-server workers.

The package sits under the planner so that every user (the planner, engines, tuning,
clusters) can ask it without an import loop.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from k3desk.core.errors import PlanError
from k3desk.core.planning.model import PlanOptions


@dataclass(frozen=True)
class Flag:
    """One option and its aliases; ``names[0]`` is the spelling k3desk writes."""

    names: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.names[0]

    def __contains__(self, arg: object) -> bool:
        """Whether ``arg`` is this option, spelled any way (``--name=value`` included)."""
        if not isinstance(arg, str):
            return False
        return arg in self.names or any(
            arg.startswith(n + "=") for n in self.names if n.startswith("--")
        )

    def value_of(self, arg: str) -> str | None:
        """The value glued on with ``=`` (``--n-cpu-moe=60`` -> "60"), else None."""
        for n in self.names:
            if n.startswith("--") and arg.startswith(n + "="):
                return arg.split("=", 1)[1]
        return None


def _flag(*names: str) -> Flag:
    return Flag(names)


# ---------------------------------------------------------------- llama-server
# common/arg.cpp in b11434 (the names in the order k3desk prefers them)
MODEL = _flag("-m", "--model")
GPU_LAYERS = _flag("-ngl", "--gpu-layers", "--n-gpu-layers")
N_CPU_MOE = _flag("--n-cpu-moe", "-ncmoe")
CPU_MOE = _flag("--cpu-moe", "-cmoe")
TENSOR_SPLIT = _flag("-ts", "--tensor-split")
CTX_SIZE = _flag("-c", "--ctx-size")
CACHE_TYPE_K = _flag("-ctk", "--cache-type-k")
CACHE_TYPE_V = _flag("-ctv", "--cache-type-v")
FLASH_ATTN = _flag("-fa", "--flash-attn")
JINJA = _flag("--jinja")
NO_WARMUP = _flag("--no-warmup")
PARALLEL = _flag("--parallel", "-np")
METRICS = _flag("--metrics")  # the counters calibration reads (k3desk.core.tuning.metrics)
THREADS = _flag("-t", "--threads")
THREADS_BATCH = _flag("-tb", "--threads-batch")
BATCH = _flag("-b", "--batch-size")
UBATCH = _flag("-ub", "--ubatch-size")
TEMP = _flag("--temp", "--temperature")
TOP_P = _flag("--top-p")
MMPROJ = _flag("--mmproj", "-mm")
NO_MMPROJ_OFFLOAD = _flag("--no-mmproj-offload")
NO_REPACK = _flag("--no-repack", "-nr")
FIT = _flag("--fit", "-fit")
VERBOSITY = _flag("-lv", "--verbosity", "--log-verbosity")
HOST = _flag("--host")
PORT = _flag("--port")
API_KEY = _flag("--api-key")
API_KEY_FILE = _flag("--api-key-file")
# which web pages may read the answers (tools/server/server-http.cpp, b11434: "localhost"
# reflects an Origin only when its host is localhost, 127.0.0.1 or ::1; the default "*"
# with credentials on echoes any Origin and allows credentials)
CORS_ORIGINS = _flag("--cors-origins")
NO_CORS_CREDENTIALS = _flag("--no-cors-credentials")
# where POST /slots/{id}?action=save|restore reads and writes (tools/server/server-context.cpp;
# a file name with no folder part, fs_validate_filename); b11434 and long before it
SLOT_SAVE_PATH = _flag("--slot-save-path")
RPC = _flag("--rpc")

SERVER_FLAGS: tuple[Flag, ...] = (
    MODEL, GPU_LAYERS, N_CPU_MOE, CPU_MOE, TENSOR_SPLIT, CTX_SIZE, CACHE_TYPE_K, CACHE_TYPE_V,
    FLASH_ATTN, JINJA, NO_WARMUP, PARALLEL, METRICS, THREADS, THREADS_BATCH, BATCH, UBATCH,
    TEMP, TOP_P, MMPROJ, NO_MMPROJ_OFFLOAD, NO_REPACK, FIT, VERBOSITY, HOST, PORT, API_KEY,
    API_KEY_FILE, CORS_ORIGINS, NO_CORS_CREDENTIALS, RPC,
)  # fmt: skip

# ---------------------------------------------------------------- rpc-server
# tools/rpc/rpc-server.cpp in b11434 (rpc_server_params_parse)
RPC_HOST = _flag("-H", "--host")
RPC_PORT = _flag("-p", "--port")
RPC_THREADS = _flag("-t", "--threads")
RPC_CACHE = _flag("-c", "--cache")

RPC_SERVER_FLAGS: tuple[Flag, ...] = (RPC_HOST, RPC_PORT, RPC_THREADS, RPC_CACHE)

DEFAULT_UBATCH = 512  # llama.cpp's -ub (common/common.h: n_ubatch)
# "-ngl 99": every layer and the output on the GPUs, whatever the layer count
ALL_LAYERS = 99


@dataclass(frozen=True)
class Offload:
    """Where a plan puts the model, as llama-server takes it."""

    gpu_layers: int | None = None  # -ngl (the output layer counts as one); None: no -ngl
    n_cpu_moe: int = 0  # --n-cpu-moe (0: left out)
    tensor_split: tuple[int, ...] = ()  # -ts, one count per CUDA device in order
    mmproj_offload: bool = True  # False: --no-mmproj-offload (with a projector)


def server_args(
    model: str, opts: PlanOptions, offload: Offload, *, no_repack: bool = False
) -> tuple[str, ...]:
    """llama-server's arguments for a plan (without --host/--port/--api-key, which
    :func:`endpoint_args` adds): the model, where it goes (``offload``), the context,
    the tuned settings in ``opts`` (threads, batch sizes), the sampling defaults, the
    projector, the person's extra arguments, and ``--no-repack`` when the plan needs it
    and they do not already ask for it."""
    args = [MODEL.name, model]
    if offload.gpu_layers is not None:
        args += [GPU_LAYERS.name, str(offload.gpu_layers)]
    if offload.n_cpu_moe > 0:
        args += [N_CPU_MOE.name, str(offload.n_cpu_moe)]
    if offload.tensor_split:
        args += [TENSOR_SPLIT.name, ",".join(str(n) for n in offload.tensor_split)]
    ctx = opts.ctx if opts.ctx is not None else opts.default_ctx
    args += [CTX_SIZE.name, str(ctx), CACHE_TYPE_K.name, opts.kv_type]
    args += [CACHE_TYPE_V.name, opts.kv_type]
    args += [FLASH_ATTN.name, "on" if opts.flash_attn else "off", JINJA.name]
    if opts.no_warmup:
        args.append(NO_WARMUP.name)
    args += [PARALLEL.name, str(opts.parallel), METRICS.name]
    for flag, value in (
        (THREADS, opts.threads), (THREADS_BATCH, opts.threads_batch), (BATCH, opts.batch),
        (UBATCH, opts.ubatch if opts.ubatch != DEFAULT_UBATCH else None),
    ):  # fmt: skip
        if value is not None:
            args += [flag.name, str(value)]
    args += [TEMP.name, repr(float(opts.temperature)), TOP_P.name, repr(float(opts.top_p))]
    if opts.mmproj is not None:
        args += [MMPROJ.name, str(opts.mmproj)]
        if not offload.mmproj_offload:
            args.append(NO_MMPROJ_OFFLOAD.name)
    args += opts.extra_args
    if no_repack and not has(opts.extra_args, NO_REPACK):
        args.append(NO_REPACK.name)
    return tuple(args)


def endpoint_args(
    host: str,
    port: int,
    *,
    api_key: str = "",
    key_file: Path | None = None,
    local_cors: bool = False,
    cors_origin: str = "",
) -> tuple[str, ...]:
    """Where llama-server listens and the key it requires: from a private file when
    ``key_file`` is given (other local users can read a command line in /proc).

    With ``local_cors`` (an engine that has the flags), only pages served from this
    machine (localhost, 127.0.0.1, ::1) may read its answers in a browser, without
    credentials: llama-server's default answers a page of any site with its Origin echoed
    and credentials allowed.  k3desk's own clients are no browser and need no CORS."""
    key = (API_KEY_FILE.name, str(key_file)) if key_file else (API_KEY.name, api_key)
    cors: tuple[str, ...] = ()
    if local_cors:
        # one origin the person listed (the local API reached over the network), else this
        # machine's pages.  One only: llama-server sends --cors-origins as it was given in
        # Access-Control-Allow-Origin (server-http.cpp), and a browser refuses a list there
        cors = (CORS_ORIGINS.name, cors_origin or "localhost", NO_CORS_CREDENTIALS.name)
    return (HOST.name, host, PORT.name, str(port), *key, *cors)


def engine_defaults_args(model: str, ctx: int, mmproj: Path | None) -> tuple[str, ...]:
    """llama.cpp's own defaults for a model: only the model, the context and the
    projector (what a person running llama-server by hand would start with)."""
    args = [MODEL.name, model, CTX_SIZE.name, str(ctx)]
    if mmproj is not None:
        args += [MMPROJ.name, str(mmproj)]
    return tuple(args)


def canary_args(
    model: Path, *, mmproj: Path | None = None, verbosity: int | None = None
) -> tuple[str, ...]:
    """A probe's test load: a tiny model, a tiny context, one slot."""
    args = [MODEL.name, str(model), CTX_SIZE.name, "256", PARALLEL.name, "1"]
    if verbosity is not None:
        args += [VERBOSITY.name, str(verbosity)]
    if mmproj is not None:
        args += [MMPROJ.name, str(mmproj)]
    return tuple(args)


def rpc_base_args(ctx: int) -> tuple[str, ...]:
    """A cluster launch's arguments before the model and the workers: every layer on the
    workers' devices, the context, the chat template, no warm-up."""
    return (GPU_LAYERS.name, str(ALL_LAYERS), CTX_SIZE.name, str(ctx), JINJA.name, NO_WARMUP.name)


def rpc_server_args(model: Path, workers: str, args: Sequence[str]) -> tuple[str, ...]:
    """llama-server over rpc-server workers (``workers``: "host:port,host:port")."""
    return (MODEL.name, str(model), RPC.name, workers, *args)


def rpc_worker_args(host: str, port: int, threads: int | None, cache: bool) -> list[str]:
    """rpc-server's arguments: bound to ``host:port``, ``threads`` for a CPU worker, and a
    local tensor cache with ``cache``."""
    args = [RPC_HOST.name, host, RPC_PORT.name, str(port)]
    if threads:
        args += [RPC_THREADS.name, str(threads)]
    if cache:
        args.append(RPC_CACHE.name)
    return args


# ---------------------------------------------------------------- reading and editing
def has(args: Sequence[str], flag: Flag) -> bool:
    return any(a in flag for a in args)


def with_no_repack(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` with ``--no-repack`` (unchanged if they have it, spelled any way)."""
    return tuple(args) if has(args, NO_REPACK) else (*args, NO_REPACK.name)


def int_value(args: Sequence[str], *flags: Flag) -> int | None:
    """The integer value of the last of ``flags`` in ``args`` (None if absent or bad)."""
    value = None
    for a, b in itertools.pairwise(args):
        if any(a in f.names for f in flags):
            try:
                value = int(b)
            except ValueError:
                value = None
    return value


def without(args: Sequence[str], *flags: Flag) -> tuple[str, ...]:
    """``args`` less ``flags`` and their values."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif any(a in f.names for f in flags):
            skip = True
        else:
            out.append(a)
    return tuple(out)


def n_cpu_moe_value(args: Sequence[str]) -> int | None:
    """The last ``--n-cpu-moe`` value in ``args`` (the one llama-server uses)."""
    value: int | None = None
    for i, a in enumerate(args):
        glued = N_CPU_MOE.value_of(a)
        if a in N_CPU_MOE.names and i + 1 < len(args):
            value = int(args[i + 1])
        elif glued is not None:
            value = int(glued)
    return value


def take_cpu_moe(extra: Sequence[str], n_layers: int) -> tuple[tuple[str, ...], int | None]:
    """``--n-cpu-moe N`` / ``-ncmoe N`` / ``--cpu-moe`` taken out of the extra arguments:
    (the rest, the layer count they ask for, None if none).  ``--cpu-moe`` is every layer."""
    kept: list[str] = []
    n_cpu_moe: int | None = None
    i = 0
    while i < len(extra):
        a = extra[i]
        raw = N_CPU_MOE.value_of(a)
        if a in N_CPU_MOE.names:
            if i + 1 >= len(extra):
                raise PlanError(f"{a} needs a number of layers.", f"For example: {a} 60.")
            raw = extra[i + 1]
            i += 1
        elif a in CPU_MOE.names:
            n_cpu_moe = n_layers
        elif raw is None:
            kept.append(a)
        i += 1
        if raw is None:
            continue
        try:
            n_cpu_moe = int(raw)
        except ValueError:
            raise PlanError(
                f"--n-cpu-moe needs a whole number of layers, not {raw!r}.",
                f"Use a number from 0 to {n_layers}.",
            ) from None
    return tuple(kept), n_cpu_moe


def bump_n_cpu_moe(
    args: Sequence[str], n_layers: int = 0, step: int = 0
) -> tuple[tuple[str, ...], str] | None:
    """Keep more expert layers in RAM: raise ``--n-cpu-moe`` by ``step`` (default about a
    tenth of the layers, at least 1; 4 when the layer count is unknown).  ``--n-cpu-moe N``
    covers layers 0..N-1, so N = ``n_layers`` puts every expert in RAM; None then."""
    out = list(args)
    if has(out, CPU_MOE):
        return None
    if step <= 0:
        step = max(1, math.ceil(n_layers / 10)) if n_layers else 4
    current, index = 0, -1
    for i, a in enumerate(out):
        glued = N_CPU_MOE.value_of(a)
        if a in N_CPU_MOE.names and i + 1 < len(out):
            current, index = int(out[i + 1]), i + 1
        elif glued is not None:
            current = int(glued)
            out[i] = N_CPU_MOE.name
            out.insert(i + 1, str(current))
            index = i + 1
    limit = n_layers or None
    if limit is not None and current >= limit:
        return None
    new = current + step if limit is None else min(limit, current + step)
    if index >= 0:
        out[index] = str(new)
    else:
        out += [N_CPU_MOE.name, str(new)]
    return (
        tuple(out),
        f"re-planned after GPU out-of-memory: --n-cpu-moe {current} -> {new} "
        f"(expert weights of {new - current} more layer{'s' if new - current > 1 else ''} "
        "kept in RAM)",
    )
