"""llama.cpp's own tools as the oracle: the files they write, and whether they load a file.

``build_sets`` makes the llama.cpp-written test sets from the tiny wide Kimi-K3
(``k3desk.devtools tiny-k3 --wide``): ``llama-imatrix`` computes an importance
matrix on it, ``llama-quantize`` turns it into Q4_K_M, Q2_K, Q8_0 and IQ2_XXS
files, and ``llama-gguf-split`` splits each by tensor count and by size.  About
ten seconds on 2 cores, once per test session.

``llama_loads`` is the verdict: ``llama-completion -m FILE -n 1`` loads the
model, builds its graph, evaluates a prompt and samples one token (the
warm-up run and the memory-fitting pass are skipped: the prompt runs the same
graph, and the fitting pass only loads the model a second time).  Exit 0 is
"loads"; anything else (an error exit, an abort, a crash, a hang) is "refuses".
Many files are judged at once, one process per core.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from k3desk.devtools.tinyk3 import write_tiny_k3

QUANT_TYPES = ("Q4_K_M", "Q2_K", "Q8_0", "IQ2_XXS")
STEM = "Tiny-K3"
LOAD_TIMEOUT = 60.0


@dataclass(frozen=True)
class Verdict:
    loads: bool
    rc: int | None  # None: it hung and was killed
    why: str  # the engine's last error line, when it refused


def tool(bin_dir: Path, name: str) -> Path:
    exe = bin_dir / name
    if not exe.is_file():
        raise FileNotFoundError(f"{exe} is missing: the engine build lacks llama.cpp's tools")
    return exe


def _run(argv: Sequence[str | Path], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        check=False,
    )
    if out.returncode != 0:
        tail = (out.stdout + out.stderr)[-3000:]
        raise RuntimeError(f"{Path(str(argv[0])).name} failed ({out.returncode}):\n{tail}")
    return out


def _why(text: str) -> str:
    """The line of a llama.cpp log that says why it stopped."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for marks in (
        ("GGML_ASSERT", "error loading model:", "gguf_init_from", "Segmentation fault"),
        (" E ", "error", "failed", "terminate", "exception"),
    ):
        for ln in lines:
            if any(m in ln for m in marks):
                return ln[-300:]
    return lines[-1][-300:] if lines else ""


def llama_loads(bin_dir: Path, model: Path, timeout: float = LOAD_TIMEOUT) -> Verdict:
    """Whether llama.cpp loads ``model`` (part 1 of a set) and generates a token."""
    argv = [
        str(tool(bin_dir, "llama-completion")),
        "-m", str(model), "-n", "1", "-p", "hi", "-no-cnv", "-t", "1", "-c", "256",
        "--seed", "1", "--no-warmup", "-fit", "off",
    ]  # fmt: skip
    try:
        out = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else ""
        return Verdict(False, None, f"no answer in {timeout:.0f} s: {_why(text)}")
    if out.returncode == 0:
        return Verdict(True, 0, "")
    return Verdict(False, out.returncode, _why(out.stdout + "\n" + out.stderr))


def llama_verdicts(bin_dir: Path, models: Sequence[Path]) -> list[Verdict]:
    """``llama_loads`` for every model, one process per core."""
    workers = max(1, min(len(models), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda m: llama_loads(bin_dir, m), models))


@dataclass
class OracleSets:
    """What llama.cpp's tools wrote, by type: unsplit, split by count, split by size."""

    root: Path
    f16: Path
    mmproj: Path
    imatrix: Path
    quantized: dict[str, Path] = field(default_factory=dict)
    by_count: dict[str, list[Path]] = field(default_factory=dict)
    by_size: dict[str, list[Path]] = field(default_factory=dict)

    def all_sets(self) -> list[tuple[str, list[Path]]]:
        """(label, parts) of the 12 sets: each type unsplit and split both ways."""
        out: list[tuple[str, list[Path]]] = []
        for t in QUANT_TYPES:
            out += [
                (f"{t}", [self.quantized[t]]),
                (f"{t} split by tensor count", self.by_count[t]),
                (f"{t} split by size", self.by_size[t]),
            ]
        return out


def _calibration_text() -> str:
    rng = random.Random(0)
    words = [
        "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while",
        "experts", "route", "tokens", "through", "attention", "layers", "and", "a", "model",
        "answers", "the", "question", "about", "paris", "france", "image",
    ]  # fmt: skip
    return " ".join(rng.choice(words) for _ in range(2000))


def _split(bin_dir: Path, src: Path, out_dir: Path, stem: str, *args: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    _run([tool(bin_dir, "llama-gguf-split"), "--split", *args, src, out_dir / stem])
    parts = sorted(out_dir.glob(f"{stem}-*-of-*.gguf"))
    if len(parts) < 2:
        raise RuntimeError(f"llama-gguf-split {' '.join(args)} wrote {len(parts)} part(s)")
    return parts


def _quantize(bin_dir: Path, src: Path, root: Path, qtype: str, imatrix: Path | None) -> Path:
    q = root / qtype / f"{STEM}-{qtype}.gguf"
    q.parent.mkdir(parents=True, exist_ok=True)
    im = ["--imatrix", imatrix] if imatrix is not None else []
    _run([tool(bin_dir, "llama-quantize"), *im, src, q, qtype])
    return q


def split_by_size(bin_dir: Path, q: Path, out_dir: Path) -> list[Path]:
    """``q`` cut by ``llama-gguf-split --split-max-size`` into about three parts."""
    mib = max(1, q.stat().st_size // (3 << 20))
    return _split(bin_dir, q, out_dir, q.stem, "--split-max-size", f"{mib}M")


def build_sets(bin_dir: Path, root: Path) -> OracleSets:
    """Write the tiny wide model and let llama.cpp's tools quantize and split it."""
    base = write_tiny_k3(root / "f16", mmproj=True, name=f"{STEM}-F16", wide=True)
    assert base.mmproj is not None
    text = root / "calibration.txt"
    text.write_text(_calibration_text(), encoding="utf-8")
    imatrix = root / "imatrix.gguf"
    _run([
        tool(bin_dir, "llama-imatrix"), "-m", base.first_part, "-f", text, "-o", imatrix,
        "-c", "128", "--chunks", "4", "-t", str(os.cpu_count() or 1),
    ])  # fmt: skip
    sets = OracleSets(root, base.first_part, base.mmproj, imatrix)
    for t in QUANT_TYPES:
        q = _quantize(bin_dir, base.first_part, root, t, imatrix)
        sets.quantized[t] = q
        sets.by_count[t] = _split(
            bin_dir, q, root / t / "by-count", q.stem, "--split-max-tensors", "64"
        )
        sets.by_size[t] = split_by_size(bin_dir, q, root / t / "by-size")
    return sets


def one_set(bin_dir: Path, root: Path, qtype: str = "Q4_K_M") -> tuple[list[Path], Path]:
    """One llama.cpp-written set (``qtype`` without an imatrix, split by size) and its
    projector, for tests that need only one."""
    base = write_tiny_k3(root / "f16", mmproj=True, name=f"{STEM}-F16", wide=True)
    assert base.mmproj is not None
    q = _quantize(bin_dir, base.first_part, root, qtype, None)
    return split_by_size(bin_dir, q, root / qtype / "by-size"), base.mmproj


def load_sets(root: Path) -> OracleSets:
    """The sets :func:`build_sets` wrote into ``root`` earlier."""
    sets = OracleSets(
        root,
        root / "f16" / f"{STEM}-F16.gguf",
        root / "f16" / f"mmproj-{STEM}-F16-F16.gguf",
        root / "imatrix.gguf",
    )
    for t in QUANT_TYPES:
        sets.quantized[t] = root / t / f"{STEM}-{t}.gguf"
        sets.by_count[t] = sorted((root / t / "by-count").glob("*.gguf"))
        sets.by_size[t] = sorted((root / t / "by-size").glob("*.gguf"))
    return sets
