"""Host-side helpers every kernel package shares: argument checks and custom-op registration."""

from __future__ import annotations

import os
from typing import Callable, Sequence

import torch

# The harness sets this when kernels execute in its gfx950 emulator, which takes CPU tensors.
DEVICE_ENV = "AMD_KERNELS_DEVICE"


def _device_ok(device: torch.device) -> bool:
    if device.type == "cuda":  # ROCm builds of torch name HIP devices "cuda"
        return True
    return device.type == "cpu" and os.environ.get(DEVICE_ENV) == "emulator"


def check_tensor(
    name: str,
    t,
    *,
    dtype: torch.dtype,
    shape: Sequence[int | None],
    like: torch.Tensor | None = None,
    hint: str = "",
) -> None:
    """Raise a TypeError/ValueError naming `name` unless `t` is a contiguous tensor of this dtype and shape.

    `shape` entries of None match any size. `like` (another argument) pins the device. `hint` is added to
    dtype and shape errors (e.g. how to prepare a weight).
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
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: data pointer is not 16-byte aligned (16-byte loads need it)")


def check_rows(name: str, t: torch.Tensor, rows: int) -> None:
    if t.shape[0] != rows:
        raise ValueError(f"{name}: expected {rows} rows (the token count of x), got {t.shape[0]}")


def custom_op(qualname: str, impl: Callable, fake: Callable, mutates_args: tuple[str, ...] = ()):
    """Register `impl` as torch.ops.<qualname> with a fake (meta) implementation.

    `mutates_args` names the arguments the entry writes in place (e.g. a KV cache); the schema declares them.

    `impl` is a warm_up.entry-decorated function; its warm_up/modes/table ride along on the op object
    so callers and the harness can warm it explicitly.
    """
    op = torch.library.custom_op(qualname, mutates_args=tuple(mutates_args))(impl)
    op.register_fake(fake)
    for attr in ("warm_up", "modes", "table"):
        setattr(op, attr, getattr(impl, attr))
    return op


def stream_of(t: torch.Tensor):
    """The stream a launch must use: torch's current stream on the GPU (so CUDA-graph capture records
    it), none under the emulator. Compiled FlyDSL functions take it as their last argument."""
    return torch.cuda.current_stream(t.device) if t.device.type == "cuda" else None
