"""Crash classification from exit status and the last log lines llama.cpp prints."""

from __future__ import annotations

import signal

import pytest

from k3desk.core.engines.crash import classify_exit, load_timeout, strip_log_prefix

# (kind, recovery, returncode, log lines as llama.cpp b11434 prints them)
CASES = [
    (
        "gpu_oom",
        "replan_cpu_moe",
        1,
        [
            "0.00.512.100 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 61440.00 MiB "
            "on device 0: cudaMalloc failed: out of memory",
            "0.00.512.200 E alloc_tensor_range: failed to allocate CUDA0 buffer of size 6442450944",
            "0.00.512.300 E llama_model_load: error loading model: unable to allocate CUDA0 buffer",
        ],
    ),
    ("gpu_oom", "replan_cpu_moe", -6, ["CUDA error: out of memory", "  current device: 0"]),
    # common_params_parse (common/arg.cpp, b11434): an unknown flag, a value it refuses
    ("invalid_argument", "none", 1, ["error: invalid argument: --no-such-flag"]),
    (
        "invalid_argument",
        "none",
        1,
        [
            'error while handling argument "--batch-size": stoi',
            "",
            "usage:",
            "-b,    --batch-size N                  logical maximum batch size (default: 2048)",
        ],
    ),
    (
        "amx_repack_assert",
        "no_repack",
        -6,
        ["/src/ggml/src/ggml-backend.cpp:1013: GGML_ASSERT(*cur_backend_id != -1) failed"],
    ),
    (
        "unknown_architecture",
        "none",
        1,
        [
            "llama_model_load: error loading model: error loading model architecture: "
            "unknown model architecture: 'kimi-k9'"
        ],
    ),
    (  # any other reason the loader gives: loading the same file again fails the same way
        "load_refused",
        "none",
        1,
        [
            "llama_model_load: error loading model: check_tensor_dims: tensor "
            "'blk.1.ffn_gate_exps.weight' has wrong shape; expected  7168,  2048,   384, got  "
            "7168,  2048,   383,     1"
        ],
    ),
    (
        "bad_magic",
        "none",
        1,
        ["gguf_init_from_file_impl: invalid magic characters: 'hell', expected 'GGUF'"],
    ),
    (
        "missing_shard",
        "none",
        1,
        [
            "llama_model_load: error loading model: failed to open GGUF file "
            "'/m/Tiny-K3-IQ1_S-00002-of-00003.gguf' (No such file or directory)"
        ],
    ),
    (
        "truncated_shard",
        "none",
        1,
        [
            "llama_model_load: error loading model: tensor 'blk.5.ffn_gate_exps.weight' data is "
            "not within the file bounds, model is corrupted or incomplete"
        ],
    ),
    ("truncated_shard", "none", 1, ["gguf_init_from_reader: failed to read tensor info"]),
    (
        "split_order",
        "none",
        1,
        [
            "illegal split file idx: 1 (file: x-00002-of-00003.gguf), model must be loaded with "
            "the first split"
        ],
    ),
    (
        "split_name",
        "none",
        1,
        ["llama_model_load: error loading model: invalid split file name: x"],
    ),
    (
        "port_in_use",
        "new_port",
        1,
        ["srv    operator(): couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080"],
    ),
    (
        "unsupported_projector",
        "none",
        1,
        [
            "clip_init: failed to load model: load_hparams: unknown projector type: kimik3",
            "srv    load_model: failed to load multimodal model, '/m/mmproj.gguf'",
        ],
    ),
    (
        "missing_library",
        "none",
        127,
        [
            "llama-server: error while loading shared libraries: libllama-common.so.0: cannot "
            "open shared object file: No such file or directory"
        ],
    ),
]


@pytest.mark.parametrize(("kind", "recovery", "rc", "lines"), CASES)
def test_log_texts_are_classified(kind: str, recovery: str, rc: int, lines: list[str]) -> None:
    tail = ["0.00.001.000 I srv  llama_server: initializing ...", *lines, "exiting"]
    report = classify_exit(rc, tail)
    assert report.kind == kind
    assert report.recovery == recovery
    assert report.summary
    assert report.fix
    assert report.evidence  # the line that gave it away is kept for the person
    assert report.returncode == rc


def test_architecture_message_names_it_and_kimi_k3_means_too_old() -> None:
    k9 = classify_exit(1, ["unknown model architecture: 'kimi-k9'"])
    assert "kimi-k9" in k9.summary
    old = classify_exit(1, ["unknown model architecture: 'kimi-k3'"])
    assert "predates kimi-k3 support" in old.summary
    assert "k3desk engine install" in old.fix


def test_missing_shard_names_the_file() -> None:
    r = classify_exit(1, ["failed to open GGUF file '/m/a-00002-of-00003.gguf' (No such file)"])
    assert "/m/a-00002-of-00003.gguf" in r.summary


def test_signals() -> None:
    ill = classify_exit(-int(signal.SIGILL), ["warming up the model with an empty run"])
    assert ill.kind == "illegal_instruction"
    assert "another CPU" in ill.summary
    assert ill.recovery == "none"
    assert "SIGILL" in ill.describe()
    assert classify_exit(132, []).kind == "illegal_instruction"  # through a shell

    killed = classify_exit(-int(signal.SIGKILL), ["load_tensors: ..."])
    assert killed.kind == "killed"  # not blamed on the OOM killer without the kernel's word
    assert killed.recovery == "restart"
    assert "from outside k3desk; if memory was short" in killed.summary
    sure = classify_exit(-int(signal.SIGKILL), [], oom_killer_seen=True)
    assert sure.kind == "oom_killed"
    assert sure.summary.startswith("The operating system's out-of-memory killer")

    abort = classify_exit(-int(signal.SIGABRT), ["GGML_ASSERT(n_tokens > 0) failed", "x"])
    assert abort.kind == "aborted"
    assert "GGML_ASSERT(n_tokens > 0)" in abort.summary
    assert classify_exit(-int(signal.SIGSEGV), []).kind == "segfault"


def test_unrecognised_exit_keeps_the_last_error_line() -> None:
    r = classify_exit(1, ["main: loading", "error: something new went wrong", "bye"])
    assert r.kind == "exited"
    assert "something new went wrong" in r.summary
    assert r.recovery == "restart"


def test_timeout_and_prefix() -> None:
    r = load_timeout(90, ["0.01.000.000 I load_tensors: loading model tensors"])
    assert r.kind == "load_timeout"
    assert "90 s" in r.summary
    assert strip_log_prefix("0.00.017.348 W load: x\n") == "load: x"
    assert strip_log_prefix("plain line") == "plain line"


@pytest.mark.parametrize(
    "line",
    [
        # b11434's load_tensors when the repacked weights do not fit in RAM
        "0.01.43.120 E llama_model_load: error loading model: unable to allocate CPU_REPACK buffer",
        "alloc_tensor_range: failed to allocate CUDA_Host buffer of size 2147483648",
        "llama_model_load: error loading model: mmap failed: Cannot allocate memory",
        "terminate called after throwing an instance of 'std::bad_alloc'",
    ],
)
def test_running_out_of_ram_is_a_memory_failure_not_a_refused_file(line: str) -> None:
    r = classify_exit(1, ["srv    load_model: loading model 'K3-00001-of-00094.gguf'", line])
    assert r.kind == "ram_oom"
    assert "refused the model file" not in r.summary
    assert "RAM" in r.summary
    # the re-plan changes what matters: the repacked copies go (--no-repack)
    assert r.recovery == "no_repack"
    assert "--no-repack" in r.fix
    if "CPU_REPACK" in line:
        assert r.summary == "The engine ran out of RAM allocating its CPU_REPACK buffer."
