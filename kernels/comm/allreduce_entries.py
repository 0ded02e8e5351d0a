"""Host code of comm/allreduce_ranks8_h2880 (the family's device code is allreduce.py, written for its one
shape so far): allreduce, allreduce_fused_add_rmsnorm, allreduce_fused_add_rmsnorm_mxfp8.

Entries (torch.ops.amd_kernels.allreduce_ranks8_h2880_<entry>; README.md has the arguments): each rank calls
with its own partial x [tokens, 2880] and gets the full result; every rank must call the same entry with the
same token count, after amd_kernels.comm.communicator.create(group) on all 8 ranks.

(No `from __future__ import annotations`: torch.library reads the entries' annotations as types.)
"""

from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up
from amd_kernels.comm import allreduce as kernel
from amd_kernels.comm import communicator

H = kernel.H
OPS = ("allreduce", "allreduce_fused_add_rmsnorm", "allreduce_fused_add_rmsnorm_mxfp8")


# From this many tokens the two-stage tier (reduce-scatter, then all-gather: 2 x 7/8 of the rows over xGMI
# per rank instead of 7 x) runs; below it the one-stage tier (one barrier round trip fewer, and one workgroup
# per row where the two-stage workgroup norms its group's 8 rows in turn). Both give the same bits for every
# row, so the edge is a speed choice only: the crossover of the cost model's projections of the layer's two
# fused all-reduces together (README: "Tiers"); not yet timed on a GPU.
TWO_STAGE_MIN_TOKENS = 184
TIERS = ("one_stage", "two_stage")


def tier(tokens: int) -> str:
    return "two_stage" if tokens >= TWO_STAGE_MIN_TOKENS else "one_stage"


def _modes(op: str) -> dict:
    # One mode holding both tiers: every warm-up compiles both, whatever token count comes first.
    return {"all": [f"{op}.{t}" for t in TIERS]}


def _mode_of(*args, **kwargs) -> str:
    return "all"


def emulator_rows(tokens: int, tier_name: str, workgroups) -> list[int]:
    """The token rows the launch's workgroups `workgroups` ((x, y, z) ids) produce (the emulator's workgroup
    sampling checks only these rows)."""
    rows = []
    if tier_name == "one_stage":
        blocks = kernel.grid_blocks(tokens)
        for (b, _, _) in workgroups:
            rows += range(b, tokens, blocks)
    else:
        blocks = kernel.grid_blocks_two_stage(tokens)
        for (b, _, _) in workgroups:
            for g in range(b, kernel.groups(tokens), blocks):
                rows += range(g * kernel.RANKS, min((g + 1) * kernel.RANKS, tokens))
    return sorted(rows)


def emulator_workgroup_of_row(tokens: int, tier_name: str, row: int) -> tuple:
    """The (x, y, z) id of the workgroup that produces token row `row` (emulator_rows' inverse: a sampled run
    adds the one holding the last real row, so padding next to it, or inside its row group, is checked)."""
    if tier_name == "one_stage":
        return (row % kernel.grid_blocks(tokens), 0, 0)
    return ((row // kernel.RANKS) % kernel.grid_blocks_two_stage(tokens), 0, 0)


CHECK_RANKS_ENV = "AMD_KERNELS_CHECK_RANKS"


def _check_across_ranks(comm, op: str, x: torch.Tensor) -> None:
    """AMD_KERNELS_CHECK_RANKS=1: compare (entry, shape, dtype) of all ranks on the host before anything else
    (a round trip over the group per call: for debugging; without it a mismatch waits forever in the kernel).
    It runs before this rank's own argument checks, so a rank with a bad x still joins the exchange and every
    rank raises, instead of the others waiting for it."""
    import torch.distributed as dist

    mine = (op, tuple(x.shape), str(x.dtype))
    everyone = [None] * comm.ranks
    dist.all_gather_object(everyone, mine, group=comm.group)
    for r, theirs in enumerate(everyone):
        if theirs != mine:
            raise ValueError(f"x: rank {comm.rank} called {mine[0]} with x of shape {list(mine[1])} ({mine[1][0]} "
                             f"tokens) and {mine[2]}, rank {r} called {theirs[0]} with x of shape {list(theirs[1])} "
                             f"({theirs[1][0]} tokens) and {theirs[2]}")


def _check_args(x: torch.Tensor, residual=None, weight=None) -> int:
    """The tensor checks of every entry. -> tokens."""
    host.check_tensor("x", x, dtype=torch.bfloat16, shape=(None, H))
    tokens = x.shape[0]
    if residual is not None:
        host.check_tensor("residual", residual, dtype=torch.bfloat16, shape=(tokens, H), like=x)
        host.check_tensor("weight", weight, dtype=torch.bfloat16, shape=(H,), like=x)
    return tokens


# Each entry's tensor checks and output allocation, shared with its fake (host.custom_op). The communicator's
# own checks (device, registered buffer size, the cross-rank check) need its buffers: the entries add them.
def outputs_allreduce(x):
    _check_args(x)
    return torch.empty_like(x)


def outputs_fused(x, residual, weight, eps):
    _check_args(x, residual, weight)
    return torch.empty_like(x), torch.empty_like(x)


def outputs_fused_mx(x, residual, weight, eps):
    _check_args(x, residual, weight)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((x.shape[0], H // 32), dtype=torch.uint8, device=x.device)
    return q, scales, torch.empty_like(x)


def _communicator(op: str, x: torch.Tensor):
    """This rank's communicator; with AMD_KERNELS_CHECK_RANKS=1 the cross-rank check runs first (before this
    rank's own argument checks, so every rank raises on a mismatch)."""
    comm = communicator.current()
    if host.env_flag(CHECK_RANKS_ENV) and isinstance(x, torch.Tensor) and x.dim() >= 1:
        _check_across_ranks(comm, op, x)
    return comm


def _stage(comm, x: torch.Tensor) -> int:
    """Put the checked x in this rank's registered input buffer. -> tokens."""
    tokens = x.shape[0]
    if x.device != comm.device:
        raise ValueError(f"x: on device {x.device}, but the communicator's buffers are on {comm.device}")
    if tokens > comm.max_tokens:
        raise ValueError(f"x: {tokens} tokens, above the communicator's registered buffer of {comm.max_tokens} "
                         "tokens (communicator.create(max_tokens=...))")
    staged = comm.inputs[comm.rank]
    if tokens and x.data_ptr() != staged.data_ptr():
        staged[:tokens].copy_(x)
    return tokens


def _buffers(comm, tier_name: str):
    bufs = (*comm.inputs, *comm.signals, comm.signals[comm.rank])
    if tier_name == "two_stage":
        bufs += (*comm.sums, comm.sums[comm.rank])
    return bufs


def _grid(tier_name: str, tokens: int) -> tuple:
    if tier_name == "two_stage":
        return kernel.grid_blocks_two_stage(tokens), kernel.groups(tokens)
    return (kernel.grid_blocks(tokens),)


def build(package: str) -> SimpleNamespace:
    """The VARIANTS table and the three entries of the package `package` (its `__name__`, which must export
    the returned VARIANTS)."""
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v) for k, v in kernel.VARIANTS.items()})

    @warm_up.entry(table, _modes("allreduce"), _mode_of)
    def _allreduce(x: torch.Tensor) -> torch.Tensor:
        comm = _communicator("allreduce", x)
        out = outputs_allreduce(x)
        tokens = _stage(comm, x)
        if tokens:
            t = tier(tokens)
            table[f"allreduce.{t}"](*_buffers(comm, t), out, tokens, comm.rank, *_grid(t, tokens),
                                    host.stream_of(x))
        return out

    @warm_up.entry(table, _modes("allreduce_fused_add_rmsnorm"), _mode_of)
    def _fused(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        comm = _communicator("allreduce_fused_add_rmsnorm", x)
        out, residual_out = outputs_fused(x, residual, weight, eps)
        tokens = _stage(comm, x)
        if tokens:
            t = tier(tokens)
            table[f"allreduce_fused_add_rmsnorm.{t}"](
                *_buffers(comm, t), residual, weight, out, residual_out, tokens, comm.rank, eps, *_grid(t, tokens),
                host.stream_of(x),
            )
        return out, residual_out

    @warm_up.entry(table, _modes("allreduce_fused_add_rmsnorm_mxfp8"), _mode_of)
    def _fused_mx(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        comm = _communicator("allreduce_fused_add_rmsnorm_mxfp8", x)
        q, scales, residual_out = outputs_fused_mx(x, residual, weight, eps)
        tokens = _stage(comm, x)
        if tokens:
            t = tier(tokens)
            table[f"allreduce_fused_add_rmsnorm_mxfp8.{t}"](
                *_buffers(comm, t), residual, weight, q, scales, residual_out, tokens, comm.rank, eps,
                *_grid(t, tokens), host.stream_of(x),
            )
        return q, scales, residual_out

    ns = f"amd_kernels::{host.shape_token(package)}_"
    return SimpleNamespace(
        VARIANTS=table,
        allreduce=host.custom_op(ns + "allreduce", _allreduce, outputs_allreduce),
        allreduce_fused_add_rmsnorm=host.custom_op(ns + "allreduce_fused_add_rmsnorm", _fused, outputs_fused),
        allreduce_fused_add_rmsnorm_mxfp8=host.custom_op(ns + "allreduce_fused_add_rmsnorm_mxfp8", _fused_mx,
                                                         outputs_fused_mx),
    )
