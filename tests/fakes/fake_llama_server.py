"""A stand-in for llama-server that fails the way the real one does.

Used where the real engine cannot be made to fail on this machine (no GPU,
no AMX, no OOM killer on demand).  ``FAKE_LLAMA_MODE`` picks the behaviour;
the messages are copied from llama.cpp b11434's source and logs, and the exit
is the real one (exit code 1, SIGILL, SIGABRT, SIGKILL).

Modes:
  serve          answer /health, /props, /v1/models, /v1/chat/completions (Bearer key)
  gpu_oom        CUDA out of memory while loading; serves instead when
                 --n-cpu-moe >= $FAKE_OOM_BELOW (to exercise re-planning), or when
                 the model's path lacks $FAKE_OOM_MODEL (so that a probe's canary loads)
  sigill         dies with SIGILL during warm-up (a native build on the wrong CPU)
  sigill_version dies with SIGILL even on --version
  amx            GGML_ASSERT(*cur_backend_id != -1) then abort, unless --no-repack
  repack_oom     "unable to allocate CPU_REPACK buffer" (out of RAM), unless --no-repack
  oom_killer     killed with SIGKILL while loading, as the kernel's OOM killer does; it
                 leaves the kernel's traces where $FAKE_OOM_EVENTS (a memory.events file:
                 oom_kill goes up) and $FAKE_KMSG (a kernel log: the OOM report) say
  old_engine     an engine from before kimi-k3 support
  bad_projector  loads the model but refuses the projector
In every mode that serves, a --mmproj file is read as the real clip loader reads it: a
``clip.projector_type`` the engine does not know ($FAKE_PROJECTOR_TYPES, comma-separated,
default "mlp" as upstream knows it; a fork adds e.g. "kimik3") ends the load with
upstream's message ("unknown projector type: X").
  cuda89         a CUDA build for sm_89 on a machine with an H200
  ignore_term    serves, and ignores SIGTERM (the supervisor must SIGKILL it)
  wrong_key      serves, but expects an API key other than the one it was given
$FAKE_GPU (any value) makes any mode list a CUDA device (a CUDA build), so that a plan
for a GPU machine keeps its GPUs (an engine without a GPU backend gets none).
$FAKE_BIND_DELAY (seconds) makes any serving mode wait that long before it binds its port,
as a large model's load does (another program can take the port meanwhile).
Only the standard library is used: this runs outside the project's venv too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODE = os.environ.get("FAKE_LLAMA_MODE", "serve")
T0 = time.monotonic()


def log(msg: str, level: str = "I") -> None:
    t = time.monotonic() - T0
    stamp = f"0.{int(t // 60):02d}.{int(t % 60):03d}.{int((t % 1) * 1000):03d}"
    sys.stdout.write(f"{stamp} {level} {msg}\n")
    sys.stdout.flush()


def arg(name: str, default: str | None = None) -> str | None:
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
    return default


def version() -> int:
    if MODE == "sigill_version":
        os.kill(os.getpid(), signal.SIGILL)
    if MODE == "old_engine":
        print("version: 4000 (a1b2c3d)\nbuilt with GNU 12.2.0 for Linux x86_64", file=sys.stderr)
    else:
        print("version: 0.6.0-dev (build 0, commit unknown)", file=sys.stderr)
        print("built with GNU 12.2.0 for Linux x86_64", file=sys.stderr)
    return 0


HELP = """----- common params -----

-h,    --help, --usage                  print usage and exit
--version                               show version and build info
-c,    --ctx-size N                     size of the prompt context
-m,    --model FNAME                    model path to load
--host HOST                             IP addresses to listen on
--port PORT                             port to listen (default: 8080)
--api-key KEY                           API key to use for authentication
--jinja, --no-jinja                     whether to use jinja template for chat
-mm,   --mmproj FILE                    path to a multimodal projector file
--mmproj-offload, --no-mmproj-offload   whether to enable GPU offloading for multimodal projector
-ncmoe, --n-cpu-moe N                   keep the MoE weights of the first N layers in the
                                        CPU
--repack, -nr, --no-repack              whether to enable weight repacking (default: enabled)
"""
HELP_NEW = """-fit,  --fit [on|off]                   whether to adjust unset arguments to fit
-lv,   --verbosity, --log-verbosity N   Set the verbosity threshold
--api-key-file FNAME                    path to file containing API keys, one per line
--rpc SERVERS                           comma-separated list of RPC servers (host:port)
"""


def list_devices() -> int:
    print("Available devices:")
    if MODE in ("cuda89", "gpu_oom") or os.environ.get("FAKE_GPU"):
        print("  CUDA0: NVIDIA H200 (143771 MiB, 143181 MiB free)")
    else:
        print("  (none)")
    return 0


def loading_preamble() -> None:
    log("srv  llama_server: initializing ...")
    log(f"srv    load_model: loading model '{arg('-m', 'model.gguf')}'")
    if MODE == "cuda89":
        log(
            "cmn  common_param: system_info: n_threads = 2 / 2 | CUDA : ARCHS = 890 | "
            "USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | CPU : SSE3 = 1 | AVX2 = 1 |"
        )
    log("llama_model_loader: loaded meta data with 44 key-value pairs and 201 tensors")
    log("load_tensors: loading model tensors, this can take a while... (load_mode = mmap)")


def kernel_traces() -> None:
    """What the kernel records when its OOM killer ends this process (for the fake tree)."""
    events = os.environ.get("FAKE_OOM_EVENTS")
    if events:
        lines = Path(events).read_text().splitlines()
        bumped = [
            f"oom_kill {int(x.split()[1]) + 1}" if x.startswith("oom_kill ") else x for x in lines
        ]
        Path(events).write_text("\n".join(bumped) + "\n")
    kmsg = os.environ.get("FAKE_KMSG")
    if kmsg:
        with open(kmsg, "a") as f:
            f.write(
                f"3,901,{int(time.monotonic() * 1e6)},-;Out of memory: Killed process "
                f"{os.getpid()} (llama-server) total-vm:431250412kB, anon-rss:20911404kB, "
                "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:42000kB oom_score_adj:0\n"
            )


def fail_load(lines: list[str]) -> int:
    for line in lines:
        log(line, "E")
    log(f"srv    load_model: failed to load model, '{arg('-m')}'", "E")
    log("srv  llama_server: exiting due to model loading error", "E")
    return 1


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(0)


def serve() -> int:
    host = arg("--host", "127.0.0.1") or "127.0.0.1"
    port = int(arg("--port", "8080") or 8080)
    key = arg("--api-key")
    key_file = arg("--api-key-file")
    if key_file:
        key = Path(key_file).read_text().split()[0]
    if MODE == "wrong_key":
        key = "a-key-nobody-gave-it"
    has_mmproj = arg("--mmproj") is not None
    time.sleep(float(os.environ.get("FAKE_BIND_DELAY", "0")))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, code: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self._send(401, {"error": {"code": 401, "message": "Invalid API Key"}})
                return False
            return True

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif not self._authorized():
                return
            elif self.path == "/props":
                self._send(200, {"modalities": {"vision": has_mmproj, "audio": False}})
            elif self.path == "/v1/models":
                self._send(200, {"data": [{"id": arg("-m")}]})
            else:
                self._send(404, {"error": {"message": "File Not Found"}})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            n = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(n)
            self._send(
                200,
                {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]},
            )

    try:
        httpd = ThreadingHTTPServer((host, port), Handler)
    except OSError:
        log(
            f"srv    operator(): couldn't bind HTTP server socket, hostname: {host}, port: {port}",
            "E",
        )
        return 1
    if MODE == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, _exit_on_term)
    log("srv  llama_server: model loaded")
    log(f"srv  llama_server: listening on http://{host}:{port}")
    try:
        httpd.serve_forever(poll_interval=0.05)
    except SystemExit:
        log("srv    operator(): operator(): cleaning up before exit...")
    return 0


def projector_type(path: str) -> str | None:
    """``clip.projector_type`` of a GGUF file, or None (not there, not GGUF, no such key)."""
    import struct

    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return None
            f.read(4)
            _, n_kv = struct.unpack("<QQ", f.read(16))
            sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

            def text() -> str:
                (n,) = struct.unpack("<Q", f.read(8))
                return f.read(n).decode("utf-8", "replace")

            def skip(t: int) -> None:
                if t in sizes:
                    f.read(sizes[t])
                elif t == 8:
                    text()
                elif t == 9:
                    (et,) = struct.unpack("<I", f.read(4))
                    (n,) = struct.unpack("<Q", f.read(8))
                    for _ in range(n):
                        skip(et)

            for _ in range(n_kv):
                key = text()
                (t,) = struct.unpack("<I", f.read(4))
                if key == "clip.projector_type" and t == 8:
                    return text()
                skip(t)
    except (OSError, struct.error, ValueError):
        return None
    return None


def main() -> int:
    argv = sys.argv[1:]
    if "--version" in argv:
        return version()
    if "--help" in argv or "-h" in argv:
        print(HELP + ("" if MODE == "old_engine" else HELP_NEW))
        return 0
    if "--list-devices" in argv:
        return list_devices()
    if MODE == "sigill_version":
        os.kill(os.getpid(), signal.SIGILL)
    loading_preamble()
    if MODE == "gpu_oom":
        below = int(os.environ.get("FAKE_OOM_BELOW", "1000000"))
        model = os.environ.get("FAKE_OOM_MODEL", "")
        if int(arg("--n-cpu-moe", "0") or 0) < below and model in (arg("-m") or ""):
            log(
                "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 61440.00 MiB on device 0: "
                "cudaMalloc failed: out of memory",
                "E",
            )
            log("alloc_tensor_range: failed to allocate CUDA0 buffer of size 64424509440", "E")
            return fail_load(
                [
                    "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
                    "llama_model_load_from_file_impl: failed to load model",
                ]
            )
    elif MODE == "sigill":
        log("cmn  common_init_: warming up the model with an empty run - please wait ...")
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGILL)
    elif MODE == "amx" and "--no-repack" not in argv and "-nr" not in argv:
        log("load_tensors:   CPU_REPACK model buffer size =  1620.00 MiB")
        sys.stdout.write(
            "/llama.cpp/ggml/src/ggml-backend.cpp:1013: GGML_ASSERT(*cur_backend_id != -1) failed\n"
        )
        sys.stdout.flush()
        os.abort()
    elif MODE == "repack_oom" and "--no-repack" not in argv and "-nr" not in argv:
        # b11434 on a model whose repacked weights exceed RAM (ggml-backend.cpp's
        # ggml_backend_cpu_buffer_type_alloc_buffer, then llama-model.cpp's load_tensors)
        log("ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size "
            "29839288320", "E")  # fmt: skip
        return fail_load(["llama_model_load: error loading model: unable to allocate "
                          "CPU_REPACK buffer"])  # fmt: skip
    elif MODE == "oom_killer":
        log("load_tensors:   CPU_Mapped model buffer size = 412345.00 MiB")
        time.sleep(0.1)
        kernel_traces()
        os.kill(os.getpid(), signal.SIGKILL)
    elif MODE == "old_engine":
        return fail_load(
            [
                "llama_model_load: error loading model: error loading model architecture: "
                "unknown model architecture: 'kimi-k3'",
                "llama_model_load_from_file_impl: failed to load model",
            ]
        )
    elif MODE == "bad_projector" and arg("--mmproj"):
        log("clip_model_loader: model name:   mmproj", "I")
        log("clip_init: failed to load model: load_hparams: unknown projector type: kimik3", "E")
        log(f"srv    load_model: failed to load multimodal model, '{arg('--mmproj')}'", "E")
        log("srv  llama_server: exiting due to model loading error", "E")
        return 1
    mmproj = arg("--mmproj")
    kind = projector_type(mmproj) if mmproj else None
    known = os.environ.get("FAKE_PROJECTOR_TYPES", "mlp").split(",")
    if mmproj and kind is not None and kind not in known:
        log(f"clip_init: failed to load model '{mmproj}': load_hparams: unknown projector "
            f"type: {kind}", "E")  # fmt: skip
        log(f"mtmd_init_from_file: error: Failed to load CLIP model from {mmproj}", "E")
        log(f"srv    load_model: failed to load multimodal model, '{mmproj}'", "E")
        log("srv  llama_server: exiting due to model loading error", "E")
        return 1
    return serve()


if __name__ == "__main__":
    sys.exit(main())
