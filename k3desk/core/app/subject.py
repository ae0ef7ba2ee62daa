"""What is being judged: this machine, the machine a hardware file describes, or a cluster.

Planning for a machine k3desk does not run on is a question ("would it fit there?"),
never an instruction: a launch always plans for the machine (or cluster) it runs on
(:mod:`k3desk.core.app.launch`).  Every page that judges tiers names its
:class:`Subject`, so the person always knows which machine the numbers are for and
how to get back to this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from k3desk.core.hardware.profile import HardwareProfile

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

SubjectKind = Literal["machine", "file", "cluster"]


@dataclass(frozen=True)
class Subject:
    """One machine (or cluster) that tiers are judged for."""

    kind: SubjectKind
    name: str  # the machine's label or host name, or the cluster's name
    path: Path | None = None  # the hardware file ("file")
    engine: str = ""  # the cluster's engine ("cluster")

    @classmethod
    def this_machine(cls, hw: HardwareProfile) -> Subject:
        return cls("machine", machine_name(hw))

    @classmethod
    def hardware_file(cls, path: Path, hw: HardwareProfile) -> Subject:
        return cls("file", machine_name(hw), path=path)

    @classmethod
    def cluster(cls, name: str, engine: str) -> Subject:
        return cls("cluster", name, engine=engine)

    @property
    def here(self) -> bool:
        """The machine k3desk runs on (what a local launch plans for)."""
        return self.kind == "machine"

    def describe(self) -> str:
        """Which machine, in words: 'this machine (vm)', 'the machine in FILE (label)', ..."""
        if self.kind == "machine":
            return f"this machine ({self.name})" if self.name else "this machine"
        if self.kind == "file":
            where = self.path.name if self.path is not None else "a hardware file"
            return (
                f"the machine in {where} ({self.name})" if self.name else f"the machine in {where}"
            )
        return f"cluster {self.name}" + (f" with {self.engine}" if self.engine else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "path": str(self.path) if self.path is not None else None,
            "engine": self.engine or None,
        }


def machine_name(hw: HardwareProfile) -> str:
    """The name a machine goes by: its label (hardware files have one), else its host name."""
    return hw.label or hw.hostname or ""


def judged_machine(
    services: Services, hardware_file: Path | None
) -> tuple[HardwareProfile, Subject]:
    """The machine a listing judges: the one in ``hardware_file``, else this one (its
    free disk measured at the models folder)."""
    if hardware_file is not None:
        hw = services.load_hardware(hardware_file)
        return hw, Subject.hardware_file(hardware_file, hw)
    hw = services.detect_hardware(services.paths.models_dir)
    return hw, Subject.this_machine(hw)
