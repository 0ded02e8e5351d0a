"""TP8 all-reduce for hidden size 2880: allreduce, allreduce_fused_add_rmsnorm, allreduce_fused_add_rmsnorm_mxfp8.

Entries (torch.ops.amd_kernels.allreduce_ranks8_h2880_<entry>; README.md has the arguments): each rank calls
with its own partial x [tokens, 2880] and gets the full result; every rank must call the same entry with the
same token count, after amd_kernels.comm.communicator.create(group) on all 8 ranks.

(No `from __future__ import annotations`: torch.library reads the entries' annotations as types.)
"""


import torch

from amd_kernels import host, warm_up
from amd_kernels.comm import communicator
from amd_kernels.comm.allreduce_ranks8_h2880 import kernel

H = kernel.H
OPS = ("allreduce", "allreduce_fused_add_rmsnorm", "allreduce_fused_add_rmsnorm_mxfp8")
VARIANTS = warm_up.VariantTable(__name__, {k: warm_up.Variant(*v) for k, v in kernel.VARIANTS.items()})


def tier(tokens: int) -> str:
    return "one_stage"


def _modes(op: str) -> dict:
    return {"one_stage": [f"{op}.one_stage"]}


def _mode_of(*args, **kwargs) -> str:
    return "one_stage"


CHECK_RANKS_ENV = "AMD_KERNELS_CHECK_RANKS"


def _check_across_ranks(comm, op: str, x: torch.Tensor) -> None:
    """AMD_KERNELS_CHECK_RANKS=1: compare (entry, tokens, dtype) of all ranks on the host before the launch (a
    round trip over the group per call: for debugging; without it a mismatch waits forever in the kernel)."""
    import torch.distributed as dist

    mine = (op, x.shape[0], str(x.dtype))
    everyone = [None] * comm.ranks
    dist.all_gather_object(everyone, mine, group=comm.group)
    for r, theirs in enumerate(everyone):
        if theirs != mine:
            raise ValueError(f"x: rank {comm.rank} called {mine[0]} with {mine[1]} tokens of {mine[2]}, rank {r} "
                             f"called {theirs[0]} with {theirs[1]} tokens of {theirs[2]}")


def _check_args(x: torch.Tensor, residual=None, weight=None) -> int:
    """The tensor checks, shared by the entries and their fakes (host.custom_op). -> tokens."""
    host.check_tensor("x", x, dtype=torch.bfloat16, shape=(None, H))
    tokens = x.shape[0]
    if residual is not None:
        host.check_tensor("residual", residual, dtype=torch.bfloat16, shape=(tokens, H), like=x)
        host.check_tensor("weight", weight, dtype=torch.bfloat16, shape=(H,), like=x)
    return tokens


def _stage(op: str, x: torch.Tensor, residual=None, weight=None):
    """Check the arguments; put x in this rank's registered input buffer. -> (communicator, tokens)."""
    comm = communicator.current()
    tokens = _check_args(x, residual, weight)
    if x.device != comm.device:
        raise ValueError(f"x: on device {x.device}, but the communicator's buffers are on {comm.device}")
    if tokens > comm.max_tokens:
        raise ValueError(f"x: {tokens} tokens, above the communicator's registered buffer of {comm.max_tokens}")
    if host.env_flag(CHECK_RANKS_ENV):
        _check_across_ranks(comm, op, x)
    staged = comm.inputs[comm.rank]
    if tokens and x.data_ptr() != staged.data_ptr():
        staged[:tokens].copy_(x)
    return comm, tokens


def _buffers(comm):
    return (*comm.inputs, *comm.signals, comm.signals[comm.rank])


@warm_up.entry(VARIANTS, _modes("allreduce"), _mode_of)
def _allreduce(x: torch.Tensor) -> torch.Tensor:
    comm, tokens = _stage("allreduce", x)
    out = torch.empty_like(x)
    if tokens:
        VARIANTS["allreduce.one_stage"](
            *_buffers(comm), out, tokens, comm.rank, kernel.grid_blocks(tokens), host.stream_of(x)
        )
    return out


@warm_up.entry(VARIANTS, _modes("allreduce_fused_add_rmsnorm"), _mode_of)
def _fused(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    comm, tokens = _stage("allreduce_fused_add_rmsnorm", x, residual, weight)
    out, residual_out = torch.empty_like(x), torch.empty_like(x)
    if tokens:
        VARIANTS["allreduce_fused_add_rmsnorm.one_stage"](
            *_buffers(comm), residual, weight, out, residual_out, tokens, comm.rank, eps, kernel.grid_blocks(tokens),
            host.stream_of(x),
        )
    return out, residual_out


def _mx_outputs(x):
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((x.shape[0], H // 32), dtype=torch.uint8, device=x.device)
    return q, scales


@warm_up.entry(VARIANTS, _modes("allreduce_fused_add_rmsnorm_mxfp8"), _mode_of)
def _fused_mx(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    comm, tokens = _stage("allreduce_fused_add_rmsnorm_mxfp8", x, residual, weight)
    q, scales = _mx_outputs(x)
    residual_out = torch.empty_like(x)
    if tokens:
        VARIANTS["allreduce_fused_add_rmsnorm_mxfp8.one_stage"](
            *_buffers(comm), residual, weight, q, scales, residual_out, tokens, comm.rank, eps,
            kernel.grid_blocks(tokens), host.stream_of(x),
        )
    return q, scales, residual_out


_NS = "amd_kernels::allreduce_ranks8_h2880_"


# The fakes run the same tensor checks as the entries (the communicator's own checks need its buffers).
def _fake_allreduce(x):
    _check_args(x)
    return torch.empty_like(x)


def _fake_fused(x, residual, weight, eps):
    _check_args(x, residual, weight)
    return torch.empty_like(x), torch.empty_like(x)


def _fake_fused_mx(x, residual, weight, eps):
    _check_args(x, residual, weight)
    return (*_mx_outputs(x), torch.empty_like(x))


allreduce = host.custom_op(_NS + "allreduce", _allreduce, _fake_allreduce)
allreduce_fused_add_rmsnorm = host.custom_op(_NS + "allreduce_fused_add_rmsnorm", _fused, _fake_fused)
allreduce_fused_add_rmsnorm_mxfp8 = host.custom_op(_NS + "allreduce_fused_add_rmsnorm_mxfp8", _fused_mx,
                                                   _fake_fused_mx)
