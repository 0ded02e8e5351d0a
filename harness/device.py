"""Where kernels execute: a gfx950 GPU through HIP, or the gfx950 emulator on this CPU.

AMD_KERNELS_DEVICE=emulator forces the emulator; =gpu forces the GPU; unset picks the GPU when the
machine has a gfx950 (ROCm torch sees one), else the emulator. Call setup() before anything imports
FlyDSL's runtime: the emulator's substitute HIP library must be loaded first.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from harness.toolchain import configure_gfx950

DEVICE_ENV = "AMD_KERNELS_DEVICE"  # the same variable kernels/host.py reads


@dataclass(frozen=True)
class Device:
    kind: str  # "gpu" or "emulator"
    torch_device: str  # "cuda" or "cpu"

    @property
    def emulated(self) -> bool:
        return self.kind == "emulator"


_device: Device | None = None


def _has_gfx950_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and "gfx950" in torch.cuda.get_device_properties(0).gcnArchName
    except (ImportError, RuntimeError, AttributeError):
        return False


def setup() -> Device:
    """Configure compiles for gfx950 and pick the executing device (idempotent)."""
    global _device
    if _device is not None:
        return _device
    configure_gfx950()
    wanted = os.environ.get(DEVICE_ENV, "")
    if wanted not in ("", "gpu", "emulator"):
        raise ValueError(f"{DEVICE_ENV}={wanted!r}: expected 'gpu' or 'emulator'")
    if wanted == "gpu" or (wanted == "" and _has_gfx950_gpu()):
        _device = Device("gpu", "cuda")
    else:
        from harness import emulator

        emulator.install()
        os.environ[DEVICE_ENV] = "emulator"
        host = sys.modules.get("amd_kernels.host")
        if host is not None:  # imported before this set-up: it reads AMD_KERNELS_DEVICE once per process
            host.reload_env()
        _device = Device("emulator", "cpu")
    return _device


def current() -> Device:
    return setup()
