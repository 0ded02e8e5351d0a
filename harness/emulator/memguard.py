"""Which memory an emulated launch may touch: the tensors an entry receives and the ones it creates.

    with emulator.guard(inputs):          # inputs: a dict/list/tuple of tensors (nested is fine)
        outputs = entry(**inputs)

A TorchDispatchMode sees every aten op run inside the block, including inside torch custom ops (the mode
re-enters itself below them), and records each tensor storage an op returns. Storages that `empty`-family
ops create are *fresh*: filled with 0xFF bytes (NaN in every float format we use) and given a written-byte
map, so a kernel load of a byte nobody wrote is reported; kernel stores and host ops that write into them
(in-place / out= arguments) mark bytes written. Launches inside the block get a sanitizer.MemoryMap of the
live storages (plus any storage a guarded call created earlier and that is still alive: cached workspaces).
"""

from __future__ import annotations

import ctypes
import sys
import weakref

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .sanitizer import MemoryMap

POISON_BYTE = 0xFF
_FRESH = {
    "aten::empty.memory_format", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::empty_permuted",
}
# storages created by any guarded call and still alive (cached workspaces stay reachable in later calls)
_created_anywhere: dict[int, tuple] = {}


def _in_warm_up() -> bool:
    """Inside an amd_kernels warm-up (a lazy one runs inside the guarded call): its tensors are compile
    examples no launch reads, so they are not recorded (poisoning them would touch every page: 1.7 GB for
    the TP1 MoE's example weights)."""
    watch = sys.modules.get("amd_kernels.compile_watch")
    return watch is not None and watch.in_warm_up()


class _Storage:
    __slots__ = ("ptr", "nbytes", "name", "shadow", "ref")

    def __init__(self, t: torch.Tensor, name: str, fresh: bool):
        st = t.untyped_storage()
        self.ptr, self.nbytes, self.name = st.data_ptr(), st.nbytes(), name
        self.shadow = np.zeros(self.nbytes, np.uint8) if fresh else None
        self.ref = t             # strong for the guard's lifetime: a view may outlive the first tensor

    def alive(self) -> bool:
        return True


def _byte_offsets(t: torch.Tensor, base: int) -> np.ndarray | slice:
    start = t.data_ptr() - base
    if t.is_contiguous():
        return slice(start, start + t.numel() * t.element_size())
    off = np.zeros(1, np.int64)
    for size, stride in zip(t.shape, t.stride()):
        off = (off[:, None] + np.arange(size, dtype=np.int64) * stride).ravel()
    return ((start + off * t.element_size())[:, None] + np.arange(t.element_size())).ravel()


class MemoryGuard(TorchDispatchMode):
    def __init__(self, roots=()):
        super().__init__()
        self.storages: dict[int, _Storage] = {}
        flat, _ = tree_flatten(roots)
        for i, t in enumerate(flat):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._add(t, f"input {i} {tuple(t.shape)} {t.dtype}", fresh=False, created=False)

    def _add(self, t: torch.Tensor, name: str, fresh: bool, created: bool = True):
        if t.device.type != "cpu" or t.untyped_storage().nbytes() == 0:
            return
        ptr = t.untyped_storage().data_ptr()
        old = self.storages.get(ptr)
        if old is not None and old.alive() and not fresh:
            return                                  # a view of a storage already recorded
        rec = _Storage(t, name, fresh)
        if fresh:
            ctypes.memset(rec.ptr, POISON_BYTE, rec.nbytes)
        self.storages[ptr] = rec
        if created:
            _created_anywhere[ptr] = (weakref.ref(t), rec.nbytes, name)

    def _mark_written(self, t: torch.Tensor):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return
        rec = self.storages.get(t.untyped_storage().data_ptr())
        if rec is not None and rec.shadow is not None and rec.alive():
            rec.shadow[_byte_offsets(t, rec.ptr)] = 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "aten" and _in_warm_up():
            return func(*args, **kwargs)
        if func.namespace != "aten":
            # a custom op: run its implementation with this mode active so its allocations are seen
            with self:
                out = func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)
        else:
            out = func(*args, **kwargs)
        name = func._schema.name + ("." + func._overloadname if func._overloadname != "default" else "")
        schema = func._schema
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) else kwargs.get(a.name)
                for t in tree_flatten(v)[0]:
                    self._mark_written(t)
        fresh = name in _FRESH
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t, f"{name} -> {tuple(t.shape)} {t.dtype}", fresh=fresh)
        return out

    def memory_map(self, extra=()) -> MemoryMap:
        ranges = {}
        for ptr, (ref, nbytes, name) in list(_created_anywhere.items()):
            if ref() is None:
                del _created_anywhere[ptr]
            else:
                ranges[ptr] = (ptr, ptr + nbytes, name + " (created by an earlier call)", None)
        for ptr, rec in self.storages.items():
            if rec.alive():
                ranges[ptr] = (ptr, ptr + rec.nbytes, rec.name, rec.shadow)
        return MemoryMap(list(ranges.values()) + list(extra))
