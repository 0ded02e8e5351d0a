"""Host-side helpers every kernel package shares: argument checks and custom-op registration."""

from __future__ import annotations

import os
from typing import Callable, Sequence

import torch
from torch._subclasses.fake_tensor import is_fake

# The harness sets this when kernels execute in its gfx950 emulator, which takes CPU tensors.
DEVICE_ENV = "AMD_KERNELS_DEVICE"


def _device_ok(device: torch.device) -> bool:
    if device.type == "cuda":  # ROCm builds of torch name HIP devices "cuda"
        return True
    return device.type == "cpu" and os.environ.get(DEVICE_ENV) == "emulator"


def _byte_address(t: torch.Tensor) -> int:
    """The data pointer, or for a tensor with no memory (meta, or a fake tensor while torch.compile traces)
    its byte offset in its storage: allocations are aligned, so the offset decides the alignment."""
    if t.device.type == "meta" or is_fake(t):
        return t.storage_offset() * t.element_size()
    return t.data_ptr()


def check_tensor(
    name: str,
    t,
    *,
    dtype: torch.dtype,
    shape: Sequence[int | None],
    like: torch.Tensor | None = None,
    hint: str = "",
    align: int = 16,
) -> None:
    """Raise a TypeError/ValueError naming `name` unless `t` is a contiguous tensor of this dtype and shape.

    `shape` entries of None match any size. `like` (another argument) pins the device. `hint` is added to
    dtype and shape errors (e.g. how to prepare a weight). `align`: the byte alignment the kernel's loads of
    `t` need (16 for dwordx4 loads; 1 for a tensor read bytewise, so a row slice of it is accepted).
    """
    why = f" ({hint})" if hint else ""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}{why}")
    if t.dim() != len(shape) or any(want is not None and want != got for want, got in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}{why}")
    if not _device_ok(t.device):
        raise ValueError(f"{name}: expected a tensor on a gfx950 GPU, got device {t.device}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{name}: on device {t.device}, but the other arguments are on {like.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (row-major), got strides {tuple(t.stride())}")
    if _byte_address(t) % align:
        raise ValueError(f"{name}: data pointer is not {align}-byte aligned (the kernel's {align}-byte loads need it)")


# Masked lanes store at this byte offset past their descriptor's end (amd_kernels.common.buffer); byte offsets
# within one descriptor are i32. A descriptor over a whole tensor therefore bounds it to OOB_OFFSET bytes.
OOB_OFFSET = 0x7FFFFFF0
# Kernels with one descriptor per row (64-bit row base) run one 64-lane wave per row: the work-item ids
# along x (i32) stay below 2^31 up to this many rows.
ROW_KERNEL_MAX_TOKENS = (1 << 31) // 64


def max_tokens_for(row_bytes: int) -> int:
    """The token bound of a kernel addressing a whole [tokens, row_bytes] tensor through one descriptor."""
    return OOB_OFFSET // row_bytes


def check_tokens(name: str, t, limit: int) -> None:
    """Raise a ValueError naming `name` when tensor `t` has more than `limit` token rows (its first dim)."""
    if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] > limit:
        raise ValueError(f"{name}: {t.shape[0]} token rows, above the {limit} this kernel supports "
                         f"(larger batches address past its buffers' 32-bit offsets); split the batch")


def custom_op(qualname: str, impl: Callable, outputs: Callable, mutates_args: tuple[str, ...] = ()):
    """Register `impl` as torch.ops.<qualname>, with `outputs` as its fake (meta) implementation.

    `outputs(*args)` is the entry's front half: it runs every argument check and returns the entry's
    freshly allocated outputs; `impl` calls it first and then launches into them. Sharing it means a meta
    tensor, or a fake tensor while torch.compile traces, gets exactly the error a real call would (and the
    same output shapes), never a silent empty tensor.
    `impl` is a warm_up.entry-decorated function; its warm_up/modes/table ride along on the op object
    so callers and the harness can warm it explicitly. `mutates_args` names the arguments the entry
    writes in place (e.g. a KV cache); the schema declares them.
    """
    op = torch.library.custom_op(qualname, mutates_args=tuple(mutates_args))(impl)
    op.register_fake(outputs)
    op.outputs = outputs
    for attr in ("warm_up", "modes", "table"):
        setattr(op, attr, getattr(impl, attr))
    return op


def stream_of(t: torch.Tensor):
    """The stream a launch must use: torch's current stream on the GPU (so CUDA-graph capture records
    it), none under the emulator. Compiled FlyDSL functions take it as their last argument."""
    return torch.cuda.current_stream(t.device) if t.device.type == "cuda" else None
