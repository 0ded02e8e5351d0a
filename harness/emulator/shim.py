"""Build and load the substitute HIP runtime (hip_shim.c) and route its module calls into Python.

The shim is compiled on first use into .cache/emulator/ (keyed by a hash of its source, built to a temp
name and renamed so concurrent pytest-xdist workers do not race). Loading it with RTLD_GLOBAL before
FlyDSL's libfly_jit_runtime.so is opened makes the dynamic loader satisfy that library's
NEEDED libamdhip64.so.7 with our already-loaded copy (same soname), so no LD_LIBRARY_PATH is needed.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from harness.toolchain import CACHE

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "hip_shim.c"
SONAME = "libamdhip64.so.7"
BUILD_DIR = CACHE / "emulator"

# Every exported HIP function carries the hip_4.2 version FlyDSL's runtime asks for.
VERSION_SCRIPT = "hip_4.2 {\n  global: hip*; emu*;\n  local: *;\n};\n"

LOAD_CB = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)
GETFN_CB = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p)
LAUNCH_CB = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_int64,
    ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
    ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
)
UNLOAD_CB = ctypes.CFUNCTYPE(None, ctypes.c_int64)

_lib = None
_callbacks = None  # keep the CFUNCTYPE objects alive


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _write_agent_enumerator(bin_dir: Path) -> None:
    """A `rocm_agent_enumerator` that reports one gfx950 agent, for tools that ask it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "rocm_agent_enumerator"
    text = "#!/bin/sh\necho gfx950\n"
    if not script.is_file() or script.read_text() != text:
        _atomic_write(script, text)
        script.chmod(0o755)


def bin_dir() -> Path:
    return BUILD_DIR / "bin"


def build() -> Path:
    """Compile the shim if its source changed; return the library path."""
    src = SOURCE.read_bytes()
    digest = hashlib.sha256(src + VERSION_SCRIPT.encode()).hexdigest()[:16]
    out_dir = BUILD_DIR / f"hip-{digest}"
    lib = out_dir / SONAME
    _write_agent_enumerator(bin_dir())
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    vs = out_dir / f"hip.{os.getpid()}.map"
    vs.write_text(VERSION_SCRIPT)
    tmp = out_dir / f"{SONAME}.{os.getpid()}.tmp"
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-O2", "-shared", "-fPIC", f"-Wl,-soname,{SONAME}", f"-Wl,--version-script={vs}",
           "-o", str(tmp), str(SOURCE)]
    subprocess.run(cmd, check=True)
    tmp.replace(lib)
    vs.unlink(missing_ok=True)
    return lib


def fly_runtime_loaded() -> bool:
    """True when FlyDSL's JIT runtime (and so some libamdhip64) is already in the process."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return "libfly_jit_runtime.so" in maps


def load():
    """Load the shim into the process with RTLD_GLOBAL (idempotent)."""
    global _lib
    if _lib is None:
        path = build()
        if fly_runtime_loaded() and str(path) not in Path("/proc/self/maps").read_text():
            raise RuntimeError(
                "FlyDSL's runtime was loaded before harness.emulator.install(): call install() first "
                "(or run under `python -m harness.emulator run`)"
            )
        _lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        if str(path) not in Path("/proc/self/maps").read_text():
            raise RuntimeError(f"loaded {path} but it is not mapped")
    return _lib


def register(load_module, get_function, launch, unload) -> None:
    """Route the shim's module calls to these Python functions."""
    global _callbacks
    lib = load()
    _callbacks = (LOAD_CB(load_module), GETFN_CB(get_function), LAUNCH_CB(launch), UNLOAD_CB(unload))
    lib.emuSetCallbacks(*_callbacks)
