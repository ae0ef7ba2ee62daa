"""k3desk's settings: one JSON file (``AppPaths.settings_file``), read and written whole.

The desktop app edits them; the CLI honours the ones that concern it (the engine
binary, above all), so both shells launch the same engine.  The
file's absence means "first run" (the app then opens the wizard).  Secrets are
never stored here: the Hugging Face token lives in the core TokenStore.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, cast

from k3desk.core.chat.client import THINKING_EFFORTS
from k3desk.core.errors import K3Error
from k3desk.core.localfiles import DamagedRecord, load_json, set_aside
from k3desk.core.private import write_private

Theme = Literal["system", "light", "dark"]
THEMES: tuple[Theme, ...] = ("system", "light", "dark")
# "" = the chat template's own default; the rest are what the Kimi-K3 template accepts
EFFORTS = ("", *THINKING_EFFORTS)
SETTINGS_SCHEMA = 1
# a web origin: scheme, host, optional port, nothing else (what a browser sends in Origin)
ORIGIN = re.compile(r"https?://([A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(:[0-9]{1,5})?")
MAX_PARALLEL = 16  # requests at once: each holds its own KDA state (about 443 MiB)
MAX_KEPT_STATE_GIB = 4096  # disk for kept conversation states


class SettingsError(K3Error):
    """The settings file cannot be read."""


@dataclass(frozen=True)
class Settings:
    # folders searched for downloaded GGUF shard sets (the first is the default download folder)
    model_dirs: tuple[str, ...] = ()
    download_dir: str = ""
    # llama-server executable; "" = find one automatically
    engine_binary: str = ""
    # chat defaults (each conversation may override)
    ctx: int = 8192
    temperature: float = 1.0
    top_p: float = 0.95
    thinking: bool = True
    thinking_effort: str = ""
    system_prompt: str = ""
    theme: Theme = "system"
    # downloads: how many shards at once
    download_workers: int = 4
    # the local API's port, the same for every launch of the app's engine and of
    # `k3desk serve` (0: a free port each launch); see core/app/local_api.py
    api_port: int = 8033
    # requests the engine answers at once (--parallel; each slot gets ctx / N)
    api_parallel: int = 1
    # the local API reachable from other devices (every IPv4 interface; keys still needed)
    api_lan: bool = False
    # the one web origin whose pages may read answers ("" = pages of this machine only)
    api_cors_origin: str = ""
    # disk for conversations' engine states (core/chat/kept_state.py), in GiB; 0 = none
    kept_state_gib: int = 16
    # what the wizard chose
    tier_id: str = ""
    hardware_file: str = ""
    wizard_done: bool = False
    # older versions' one remote server; the app moves it into the attached servers
    # (Cluster page) on start and clears it here ("" = none)
    remote_url: str = ""
    recent: dict[str, Any] = field(default_factory=dict)

    def validated(self) -> Settings:
        problems = []
        if self.ctx < 512:
            problems.append(f"ctx {self.ctx} is below 512")
        if not 0.0 <= self.temperature <= 5.0:
            problems.append(f"temperature {self.temperature} is outside 0-5")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p {self.top_p} is outside (0, 1]")
        if self.theme not in THEMES:
            problems.append(f"theme {self.theme!r} is not one of {', '.join(THEMES)}")
        if self.thinking_effort not in EFFORTS:
            problems.append(f"thinking_effort {self.thinking_effort!r} is not one of {EFFORTS}")
        if not 1 <= self.download_workers <= 16:
            problems.append(f"download_workers {self.download_workers} is outside 1-16")
        if not 0 <= self.api_port <= 65535:
            problems.append(f"api_port {self.api_port} is outside 0-65535")
        if self.api_cors_origin and not ORIGIN.fullmatch(self.api_cors_origin):
            problems.append(
                f"the local API's web origin {self.api_cors_origin[:80]!r} is not an origin "
                "(http://host or https://host:port, nothing after)"
            )
        if not 1 <= self.api_parallel <= MAX_PARALLEL:
            problems.append(f"api_parallel {self.api_parallel} is outside 1-{MAX_PARALLEL}")
        if not 0 <= self.kept_state_gib <= MAX_KEPT_STATE_GIB:
            problems.append(
                f"kept_state_gib {self.kept_state_gib} is outside 0-{MAX_KEPT_STATE_GIB}"
            )
        if problems:
            raise SettingsError("Invalid settings: " + "; ".join(problems) + ".")
        return self

    def effective_download_dir(self, default: Path) -> Path:
        if self.download_dir:
            return Path(self.download_dir).expanduser()
        if self.model_dirs:
            return Path(self.model_dirs[0]).expanduser()
        return default


class SettingsStore:
    """Loads and saves :class:`Settings` at ``path`` (atomic replace on save)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    def load(self) -> Settings:
        try:
            raw = load_json(self.path, what="settings file")
        except DamagedRecord as exc:
            if exc.content:  # not valid JSON / UTF-8 text: fixable by hand
                raise SettingsError(
                    f"The settings file {self.path} cannot be read: {exc.why}.",
                    "Fix the JSON by hand, or delete the file to start again with defaults.",
                ) from None
            # a pipe, a device, a folder, a huge file: nothing to fix by hand
            raise SettingsError(
                set_aside(self.path, exc.why, what="settings file", warn=False).replace(
                    "k3desk goes on without it", "k3desk starts again with defaults"
                ),
                "Nothing was lost: the damaged file is kept beside the new one.",
            ) from None
        except OSError as exc:
            raise SettingsError(
                f"The settings file {self.path} cannot be read: {exc.strerror or exc}",
                "Check its permissions, or delete the file to start again with defaults.",
            ) from exc
        if raw is None:
            return Settings()
        if not isinstance(raw, dict):
            raise SettingsError(
                f"The settings file {self.path} must hold a JSON object.",
                "Delete the file to start again with defaults.",
            )
        known = {f.name for f in fields(Settings)}
        values: dict[str, Any] = {}
        defaults = Settings()
        try:
            for key, value in raw.items():
                if key not in known:
                    continue
                default = getattr(defaults, key)
                if key == "model_dirs":
                    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                        raise TypeError("model_dirs must be a list of folders")
                    value = tuple(value)
                elif isinstance(default, str | bool | dict):
                    if not isinstance(value, type(default)):
                        raise TypeError(
                            f"{key} must be {type(default).__name__}, not {value!r:.40}"
                        )
                elif isinstance(value, bool) or not isinstance(value, int | float):
                    raise TypeError(f"{key} must be a number, not {value!r:.40}")
                values[key] = value
            settings = Settings(**values)
            # JSON numbers: keep types honest
            settings = replace(
                settings,
                ctx=int(settings.ctx),
                temperature=float(settings.temperature),
                top_p=float(settings.top_p),
                download_workers=int(settings.download_workers),
                api_port=int(settings.api_port),
                api_parallel=int(settings.api_parallel),
                kept_state_gib=int(settings.kept_state_gib),
                theme=cast(Theme, str(settings.theme)),
            )
        except (TypeError, ValueError, OverflowError) as exc:
            raise SettingsError(
                f"The settings file {self.path} has a value of the wrong type: {exc}",
                "Fix the value by hand, or delete the file to start again with defaults.",
            ) from exc
        try:
            return settings.validated()
        except SettingsError as exc:
            raise SettingsError(
                f"{exc.message} (in {self.path})",
                "Fix the value in the Settings page or by hand, or delete the file.",
            ) from exc

    def save(self, settings: Settings) -> None:
        settings.validated()
        data = asdict(settings)
        data["model_dirs"] = list(settings.model_dirs)
        data["schema"] = SETTINGS_SCHEMA
        write_private(self.path, json.dumps(data, indent=2) + "\n")
