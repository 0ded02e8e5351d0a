"""The Python side of the substitute HIP runtime: code-object modules, kernel handles and launches.

hip_shim.c forwards hipModuleLoadData / GetFunction / LaunchKernel / Unload here. A launch rebuilds the
kernarg segment from kernelParams, runs the emulator and records a LaunchRecord for active recorders.
Exceptions cannot cross the C frames between FlyDSL's JIT code and these callbacks, so a failed launch
returns hipErrorLaunchFailure and the exception is re-raised in Python right after FlyDSL's call returns
(see install()).
"""

from __future__ import annotations

import ctypes
import threading
import traceback

import numpy as np

from . import decoder
from .codeobject import CodeObject, elf_size, read_code_object
from .engine import execute
from .translate import Context, CounterProxy, Program, gc_paused

HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE, HIP_LAUNCH_PARAM_END = 1, 2, 3

_lock = threading.RLock()
_modules: dict[int, CodeObject] = {}
_functions: dict[int, tuple[int, str]] = {}
_function_of: dict[tuple[int, str], int] = {}  # (module, kernel) -> handle: FlyDSL asks on every launch
_programs: dict[tuple[str, int], tuple[Program, CounterProxy]] = {}
_listings: dict[str, list] = {}   # digest -> decoder.Inst records: parsed once for all kernels of a code object
_next_handle = [1]
_pending_error: list[BaseException] = []
_recorders: list[list] = []
_options_stack: list[dict] = [{}]


def _new_handle() -> int:
    _next_handle[0] += 1
    return _next_handle[0] * 16


def load_module(image_ptr: int) -> int:
    try:
        header = ctypes.string_at(image_ptr, 64)
        elf = ctypes.string_at(image_ptr, elf_size(header))
        co = read_code_object(elf)
        with _lock:
            h = _new_handle()
            _modules[h] = co
        return h
    except BaseException as e:  # noqa: BLE001 - must not unwind into C
        _pending_error.append(e)
        return 0


def get_function(module: int, name: bytes) -> int:
    kname = name.decode()
    h = _function_of.get((module, kname))
    if h is not None:
        return h
    co = _modules.get(module)
    if co is None or kname not in co.kernels:
        return 0
    with _lock:
        h = _function_of.get((module, kname))
        if h is None:
            h = _new_handle()
            _functions[h] = (module, kname)
            _function_of[(module, kname)] = h
    return h


def unload(module: int) -> None:
    with _lock:
        _modules.pop(module, None)
        for h in [h for h, (m, _) in _functions.items() if m == module]:
            _function_of.pop(_functions.pop(h), None)


def program_for(co: CodeObject, kernel_name: str) -> tuple[Program, CounterProxy]:
    """Translate a code object's kernel once (cached by code-object hash)."""
    kernel = co.kernels[kernel_name]
    acc = kernel.descriptor.accum_offset
    key = (co.digest, acc)
    with _lock:
        if key not in _programs:
            with gc_paused():
                insts = _listings.get(co.digest)
                if insts is None:
                    insts = _listings[co.digest] = decoder.disassemble(co.elf, co.digest)
                proxy = CounterProxy()
                prog = Program(insts, Context(acc_offset=acc, counters=proxy), co.text_addr, len(co.text))
                _programs[key] = (prog, proxy)
        return _programs[key]


def build_kernarg(kernel, params, extra, grid, block, dynamic_lds) -> np.ndarray:
    size = max(kernel.kernarg_segment_size, 8)
    buf = np.zeros(size + 64, np.uint8)              # slack: kernels may s_load past the last argument
    addr = buf.ctypes.data
    if extra:
        i = 0
        ptr = size_ptr = None
        while extra[i] and extra[i] != HIP_LAUNCH_PARAM_END:
            if extra[i] == HIP_LAUNCH_PARAM_BUFFER_POINTER:
                ptr = extra[i + 1]
            elif extra[i] == HIP_LAUNCH_PARAM_BUFFER_SIZE:
                size_ptr = extra[i + 1]
            i += 2
        n = ctypes.c_size_t.from_address(size_ptr).value if size_ptr else size
        ctypes.memmove(addr, ptr, min(n, size))
        return buf
    explicit = [a for a in kernel.args if not a.value_kind.startswith("hidden_")]
    for i, arg in enumerate(explicit):
        ctypes.memmove(addr + arg.offset, params[i], arg.size)
    hidden = {
        "hidden_block_count_x": grid[0], "hidden_block_count_y": grid[1], "hidden_block_count_z": grid[2],
        "hidden_group_size_x": block[0], "hidden_group_size_y": block[1], "hidden_group_size_z": block[2],
        "hidden_dynamic_lds_size": dynamic_lds, "hidden_grid_dims": 3 if grid[2] > 1 else 2 if grid[1] > 1 else 1,
    }
    for arg in kernel.args:
        if arg.value_kind in hidden:
            buf[arg.offset: arg.offset + arg.size] = np.frombuffer(
                int(hidden[arg.value_kind]).to_bytes(arg.size, "little"), np.uint8)
    return buf


def launch(fn, gx, gy, gz, bx, by, bz, shared, params, extra) -> int:
    try:
        module, kname = _functions[fn]
        co = _modules[module]
        kernel = co.kernels[kname]
        if not current_options().get("execute", True):
            return 0  # a walk that checks host behaviour only: the launch path ran, the kernel does not
        program, proxy = program_for(co, kname)
        grid, block = (gx, gy, gz), (bx, by, bz)
        kernarg = build_kernarg(kernel, params, extra, grid, block, shared)
        rec = execute(program, kernel, grid, block, kernarg, shared, proxy, current_options())
        for r in _recorders:
            r.append(rec)
        return 0
    except BaseException as e:  # noqa: BLE001 - must not unwind into C
        _pending_error.append(e)
        return 719  # hipErrorLaunchFailure


def raise_pending() -> None:
    """Re-raise the first error a callback hit since the last check."""
    if _pending_error:
        err = _pending_error[0]
        _pending_error.clear()
        raise err


def current_options() -> dict:
    return _options_stack[-1]


def format_exception(e: BaseException) -> str:
    return "".join(traceback.format_exception(e))
