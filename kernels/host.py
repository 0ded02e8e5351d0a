"""Host-side helpers every kernel package shares: argument checks and custom-op registration."""

from __future__ import annotations

import os
from typing import Callable, Sequence

import torch
from torch._library.custom_ops import CustomOpDef
from torch._subclasses.fake_tensor import is_fake

# The harness sets this when kernels execute in its gfx950 emulator, which takes CPU tensors.
DEVICE_ENV = "AMD_KERNELS_DEVICE"
# AMD_KERNELS_EAGER_DISPATCH=1: every eager call goes through torch's dispatcher (see EntryOp).
EAGER_DISPATCH_ENV = "AMD_KERNELS_EAGER_DISPATCH"

# Environment read once per process (an os.environ lookup costs ~1 us, and the checks run per tensor per
# call); reload_env() re-reads it, for tests that change these variables.
_cpu_ok = False
_always_dispatch = False
_flags: dict[str, bool] = {}


def reload_env() -> None:
    """Re-read the environment variables the host code caches (AMD_KERNELS_DEVICE, AMD_KERNELS_EAGER_DISPATCH
    and every env_flag): read once per process, then cached; tests that change them call this."""
    global _cpu_ok, _always_dispatch
    _cpu_ok = os.environ.get(DEVICE_ENV) == "emulator"
    _always_dispatch = os.environ.get(EAGER_DISPATCH_ENV, "") not in ("", "0")
    _flags.clear()


def env_flag(name: str) -> bool:
    """A debugging switch set to anything but "" or "0", read once per process (reload_env re-reads it)."""
    flag = _flags.get(name)
    if flag is None:
        flag = _flags[name] = os.environ.get(name, "") not in ("", "0")
    return flag


def no_data(t: torch.Tensor) -> bool:
    """A meta tensor, or a fake one while torch.compile traces: no memory to read or point to."""
    return t.is_meta or (type(t) is not torch.Tensor and is_fake(t))


reload_env()


def _byte_address(t: torch.Tensor) -> int:
    """The data pointer, or for a tensor with no memory (meta, or a fake tensor while torch.compile traces)
    its byte offset in its storage: allocations are aligned, so the offset decides the alignment."""
    if no_data(t):
        return t.storage_offset() * t.element_size()
    return t.data_ptr()


def check_tensor(
    name: str,
    t,
    *,
    dtype: torch.dtype,
    shape: Sequence[int | None],
    like: torch.Tensor | None = None,
    hint: str | Callable[[], str] = "",
    align: int = 16,
) -> None:
    """Raise a TypeError/ValueError naming `name` unless `t` is a contiguous tensor of this dtype and shape.

    `shape` entries of None match any size. `like` (another argument) pins the device. `hint` is added to
    dtype and shape errors (e.g. how to prepare a weight); a function returning it is called only then.
    `align`: the byte alignment the kernel's loads of `t` need (16 for dwordx4 loads; 1 for a tensor read
    bytewise, so a row slice of it is accepted). Every call of every entry runs this: it is kept lean.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}{_hint(hint)}")
    got = t.shape
    bad = len(got) != len(shape)
    if not bad:
        for want, n in zip(shape, got):
            if want is not None and want != n:
                bad = True
                break
    if bad:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(got)}{_hint(hint)}")
    device = t.device
    kind = device.type
    # ROCm builds of torch name HIP devices "cuda"; the emulator takes CPU tensors
    if not (kind == "cuda" or (kind == "cpu" and _cpu_ok)):
        raise ValueError(f"{name}: expected a tensor on a gfx950 GPU, got device {device}")
    if like is not None and device != like.device:
        raise ValueError(f"{name}: on device {device}, but the other arguments are on {like.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (row-major), got strides {tuple(t.stride())}")
    if (t.data_ptr() if type(t) is torch.Tensor else _byte_address(t)) % align:
        raise ValueError(f"{name}: data pointer is not {align}-byte aligned (the kernel's {align}-byte loads need it)")


def _hint(hint) -> str:
    """`hint` is a string or a function computing it (built only when an error needs it)."""
    hint = hint() if callable(hint) else hint
    return f" ({hint})" if hint else ""


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


class EntryOp(CustomOpDef):
    """A registered entry (torch.ops.amd_kernels.<name>) whose plain eager calls skip torch's dispatcher.

    Through the dispatcher a call pays 6-7 us more CPU time (autograd wrapper, redispatch, the alias check
    on the outputs, dynamo's disable guard; measured in benchmarks/README.md) before the entry's code runs. A call with nothing for the
    dispatcher to do - plain torch.Tensor arguments (no fake or other subclass), no dispatch or function
    mode, no functorch transform, not under torch.compile's tracing, no profiler, no argument requiring grad
    while grad mode is on - runs the entry directly: the same checks (the entry calls its `outputs` first)
    and the same launches; the mutated arguments' version counters are bumped as the dispatcher would.
    Every other call, torch.library.opcheck (it takes the OpOverload) and AMD_KERNELS_EAGER_DISPATCH=1 go
    through the dispatcher.
    """

    def __call__(self, *args, **kwargs):
        # is_compiling first: torch.compile traces this method, and takes that branch without the rest
        if torch.compiler.is_compiling() or _always_dispatch or not _plain_eager(args, kwargs):
            return self._opoverload(*args, **kwargs)
        out = self._eager(*args, **kwargs)
        if self._mutated:
            bound = dict(zip(self._arg_names, args), **kwargs)
            torch._C._increment_version([bound[name] for name in self._mutated])
        return out


_C = torch._C


def _plain_eager(args, kwargs) -> bool:
    if (_C._len_torch_dispatch_stack() or _C._len_torch_function_stack() or _C._are_functorch_transforms_active()
            or torch.autograd._profiler_enabled()):
        return False
    grad = _C.is_grad_enabled()
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor) and (type(v) is not torch.Tensor or (grad and v.requires_grad)):
            return False
    return True


def custom_op(qualname: str, impl: Callable, outputs: Callable, mutates_args: tuple[str, ...] = ()):
    """Register `impl` as torch.ops.<qualname>, with `outputs` as its fake (meta) implementation.

    `outputs(*args)` is the entry's front half: it runs every argument check and returns the entry's
    freshly allocated outputs; `impl` calls it first and then launches into them. Sharing it means a meta
    tensor, or a fake tensor while torch.compile traces, gets exactly the error a real call would (and the
    same output shapes), never a silent empty tensor.
    `impl` is a warm_up.entry-decorated function; its warm_up/modes/table ride along on the op object
    so callers and the harness can warm it explicitly. `mutates_args` names the arguments the entry
    writes in place (e.g. a KV cache); the schema declares them. The returned op is an EntryOp: a plain
    eager call runs `impl` without torch's dispatcher (its docstring says when).
    """
    op = torch.library.custom_op(qualname, mutates_args=tuple(mutates_args))(impl)
    op.register_fake(outputs)
    op.__class__ = EntryOp
    op._eager = impl
    op._mutated = tuple(mutates_args)
    op._arg_names = tuple(a.name for a in op._opoverload._schema.arguments)
    op.outputs = outputs
    for attr in ("warm_up", "modes", "table"):
        setattr(op, attr, getattr(impl, attr))
    return op


def stream_of(t: torch.Tensor):
    """The stream a launch must use: torch's current stream on the GPU (so CUDA-graph capture records
    it), none under the emulator. Compiled FlyDSL functions take it as their last argument."""
    return torch.cuda.current_stream(t.device) if t.device.type == "cuda" else None
