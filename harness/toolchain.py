"""Make FlyDSL compile for gfx950 on a machine without ROCm.

FlyDSL needs `$ROCM_PATH/llvm/bin/ld.lld` to link a code object and must be told the target: it reads
FLYDSL_GPU_ARCH (and ARCH for some paths) and otherwise silently assumes gfx942. With no ROCm present we
point ROCM_PATH at a folder of our own whose llvm/bin/ld.lld is the system's ld.lld-22.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
TARGET_ARCH = "gfx950"


def _has_rocm_linker(root: str | None) -> bool:
    return bool(root) and (Path(root) / "llvm" / "bin" / "ld.lld").is_file()


def find_system_tool(name: str) -> str | None:
    """A Debian llvm-22 tool (e.g. 'ld.lld', 'llvm-objdump', 'llvm-mc'), or None."""
    for candidate in (f"{name}-22", f"/usr/lib/llvm-22/bin/{name}"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


def rocm_shim_root() -> Path:
    """A folder laid out as ROCm's llvm/bin/ld.lld, backed by the system ld.lld-22."""
    lld = find_system_tool("ld.lld")
    if lld is None:
        raise RuntimeError(
            "no ROCm toolchain and no ld.lld-22: install Debian's lld-22 (apt-get install lld-22) "
            "or set ROCM_PATH to a ROCm installation"
        )
    root = CACHE / "rocm-shim"
    link = root / "llvm" / "bin" / "ld.lld"
    if not (link.is_symlink() and os.readlink(link) == lld):
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f"ld.lld.{os.getpid()}.tmp")
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(lld)
        tmp.replace(link)
    return root


def configure_gfx950() -> None:
    """Set the environment so every FlyDSL compile in this process (and its children) targets gfx950."""
    os.environ.setdefault("FLYDSL_RUNTIME_CACHE_DIR", str(CACHE / "flydsl"))
    if not _has_rocm_linker(os.environ.get("ROCM_PATH")):
        if _has_rocm_linker("/opt/rocm"):
            os.environ["ROCM_PATH"] = "/opt/rocm"
        else:
            os.environ["ROCM_PATH"] = str(rocm_shim_root())
    os.environ["ARCH"] = TARGET_ARCH
    os.environ["FLYDSL_GPU_ARCH"] = TARGET_ARCH
