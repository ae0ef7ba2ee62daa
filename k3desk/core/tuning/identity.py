"""Which machine and which model a measurement belongs to.

A state folder may be shared (a home folder on NFS, a copied profile), so every
record carries the machine it was measured on and is used only there.  A model
is its first part's file name with the set's size and tensor count: the same
download in another folder is the same model, a re-quantized file is not.
"""

from __future__ import annotations

import hashlib

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import HardwareProfile


def machine_key(hw: HardwareProfile) -> str:
    """A short fingerprint of this machine's CPU, memory and GPUs."""
    gpus = ",".join(f"{g.name}/{g.vram_total >> 30}" for g in hw.gpus)
    text = (
        f"{hw.hostname}|{hw.cpu.model}|{hw.cpu.physical_cores}|{hw.cpu.logical_cores}|"
        f"{hw.memory.total >> 30}|{gpus}"
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_this_machine(hw: HardwareProfile) -> bool:
    """Runs measured here say something about ``hw`` only if it was detected here
    (a hardware file describes another machine)."""
    return hw.source == "detected"


def model_key(layout: ModelLayout) -> str:
    name = layout.first_part.name if layout.parts else layout.name
    return f"{name}|{layout.total_file_bytes}|{layout.tensor_count}"


def model_label(layout: ModelLayout) -> str:
    return layout.first_part.name if layout.parts else (layout.name or "model")
