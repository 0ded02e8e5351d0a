"""The communicator: the IPC buffers and signal memory the ranks<n> kernels of one process group share.

A model creates it once per tensor-parallel group, after torch.distributed is initialized and before the
first all-reduce entry runs (every rank of the group must call it, it is collective):

    from amd_kernels.comm import communicator
    communicator.create(group, max_tokens=512)    # group: a torch.distributed group of 8 ranks (gloo is enough)

What it does, through the HIP runtime (ctypes on libamdhip64; the emulator's substitute provides the same):
- hipMalloc an input buffer of `max_tokens` rows of `hidden` bf16: the entries copy this rank's partial there
  (or the previous kernel writes it there directly: `input_buffer(tokens)`), and every peer reads it;
- hipMalloc a sums buffer of the same size: the two-stage tier stores the rows this rank summed there and
  every peer reads them (the all-gather);
- hipExtMallocWithFlags(uncached) a signal buffer of int32 flags (layout: the kernel module's
  START / END / EPOCH / SIGNAL_SLOTS), zeroed once and never reset (flags count epochs);
- hipIpcGetMemHandle on both, handles exchanged with all_gather_object over `group`,
  hipIpcOpenMemHandle on every peer's; the entries then pass the 8 buffers (as mapped in this process)
  to the kernel in rank order.
The buffers live as long as the process (kept for CUDA-graph replays that captured their addresses).
"""

from __future__ import annotations

import ctypes
import os

import torch

_HIP_DEVICE_MALLOC_UNCACHED = 0x3
_HIP_IPC_LAZY_ENABLE_PEER_ACCESS = 0x1

_current: "Communicator | None" = None


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _hip():
    lib = ctypes.CDLL("libamdhip64.so.7" if _emulated() else "libamdhip64.so")
    lib.hipIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), IpcHandle, ctypes.c_uint]
    lib.hipExtMallocWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    lib.hipMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.hipMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    lib.hipIpcGetMemHandle.argtypes = [ctypes.POINTER(IpcHandle), ctypes.c_void_p]
    return lib


def _emulated() -> bool:
    return os.environ.get("AMD_KERNELS_DEVICE") == "emulator"


def _check_hip(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"communicator: {what} failed with HIP error {err}")


def _tensor_at(ptr: int, nbytes: int, dtype: torch.dtype, shape: tuple, device: torch.device) -> torch.Tensor:
    """A tensor over `nbytes` of device memory at `ptr` (not owned: the communicator keeps it alive)."""
    if device.type == "cpu":  # the emulator: device pointers are host addresses
        raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)
    else:
        class _Mem:
            __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}

        raw = torch.as_tensor(_Mem(), device=device)
    return raw.view(dtype).view(shape)


class Communicator:
    """IPC buffers of one group of `ranks` processes; see the module docstring."""

    def __init__(self, group, *, max_tokens: int, hidden: int, signal_slots: int, ranks: int, device=None):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("communicator: torch.distributed is not initialized (init_process_group first)")
        world = dist.get_world_size(group)
        if world != ranks:
            raise ValueError(f"group: the kernels are built for {ranks} ranks, the group has {world}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: expected a positive int, got {max_tokens!r}")
        self.group, self.ranks, self.hidden, self.max_tokens = group, ranks, hidden, max_tokens
        self.rank = dist.get_rank(group)
        if device is None:
            device = torch.device("cpu") if _emulated() else torch.device("cuda", torch.cuda.current_device())
        self.device = torch.device(device)
        self._lib = lib = _hip()
        in_bytes = max_tokens * hidden * 2
        sig_bytes = signal_slots * 4
        own_in, own_sum, own_sig = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        _check_hip(lib.hipMalloc(ctypes.byref(own_in), in_bytes), "hipMalloc(input buffer)")
        _check_hip(lib.hipMalloc(ctypes.byref(own_sum), in_bytes), "hipMalloc(sums buffer)")
        _check_hip(lib.hipExtMallocWithFlags(ctypes.byref(own_sig), sig_bytes, _HIP_DEVICE_MALLOC_UNCACHED),
                   "hipExtMallocWithFlags(signal buffer, uncached)")
        _check_hip(lib.hipMemset(own_sig, 0, sig_bytes), "hipMemset(signal buffer)")
        handles = []
        for p in (own_in, own_sum, own_sig):
            h = IpcHandle()
            _check_hip(lib.hipIpcGetMemHandle(ctypes.byref(h), p), "hipIpcGetMemHandle")
            handles.append(bytes(h))
        # (rank, max_tokens, hidden) travel with the handles: a group created with other sizes is an error.
        mine = (self.rank, max_tokens, hidden, handles)
        everyone = [None] * world
        dist.all_gather_object(everyone, mine, group=group)
        for r, (peer_rank, peer_max, peer_hidden, _) in enumerate(everyone):
            if (peer_max, peer_hidden) != (max_tokens, hidden):
                raise ValueError(
                    f"max_tokens/hidden: rank {peer_rank} created its communicator with ({peer_max}, "
                    f"{peer_hidden}), this rank with ({max_tokens}, {hidden})"
                )
        self._opened = []
        in_ptrs, sum_ptrs, sig_ptrs = [], [], []
        for r, (_, _, _, (h_in, h_sum, h_sig)) in enumerate(everyone):
            if r == self.rank:
                in_ptrs.append(own_in.value)
                sum_ptrs.append(own_sum.value)
                sig_ptrs.append(own_sig.value)
                continue
            for hb, dst in ((h_in, in_ptrs), (h_sum, sum_ptrs), (h_sig, sig_ptrs)):
                p = ctypes.c_void_p()
                _check_hip(lib.hipIpcOpenMemHandle(ctypes.byref(p), IpcHandle.from_buffer_copy(hb),
                                                   _HIP_IPC_LAZY_ENABLE_PEER_ACCESS),
                           f"hipIpcOpenMemHandle(rank {r})")
                self._opened.append(p.value)
                dst.append(p.value)
        self._own = (own_in.value, own_sum.value, own_sig.value)
        self.inputs = [_tensor_at(p, in_bytes, torch.bfloat16, (max_tokens, hidden), self.device) for p in in_ptrs]
        self.sums = [_tensor_at(p, in_bytes, torch.bfloat16, (max_tokens, hidden), self.device) for p in sum_ptrs]
        self.signals = [_tensor_at(p, sig_bytes, torch.int32, (signal_slots,), self.device) for p in sig_ptrs]
        dist.barrier(group=group)  # every rank has mapped every buffer before any kernel uses them

    def input_buffer(self, tokens: int) -> torch.Tensor:
        """This rank's registered input rows [tokens, hidden]: a producer may write its output here and then
        call the entry with this tensor as x (the copy is then skipped)."""
        if tokens > self.max_tokens:
            raise ValueError(f"tokens: {tokens} is above the communicator's registered buffer of {self.max_tokens} "
                             "tokens (communicator.create(max_tokens=...))")
        return self.inputs[self.rank][:tokens]


def create(group=None, *, max_tokens: int = 8192, hidden: int = 2880, ranks: int = 8, device=None) -> Communicator:
    """Create this process's communicator for `group` (collective: every rank of the group calls it)."""
    global _current
    from amd_kernels.comm.allreduce_ranks8_h2880 import kernel

    if group is None:
        import torch.distributed as dist

        group = dist.group.WORLD
    _current = Communicator(group, max_tokens=max_tokens, hidden=hidden, signal_slots=kernel.SIGNAL_SLOTS,
                            ranks=ranks, device=device)
    return _current


def current() -> Communicator:
    """The communicator create() made; an error naming the fix when there is none yet."""
    if _current is None:
        raise RuntimeError(
            "communicator: no communicator in this process: call amd_kernels.comm.communicator.create(group) "
            "on every rank before the first all-reduce entry"
        )
    return _current
