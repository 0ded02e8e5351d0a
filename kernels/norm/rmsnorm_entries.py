"""Host code shared by the RMSNorm family packages (one package per hidden size).

Each package's kernel.py holds its FlyDSL kernels and `VARIANTS["<op>.<tier>"] = (launcher, example_args)`;
this module checks arguments, allocates outputs, picks the tier by token count and registers the four
entries as torch custom ops torch.ops.amd_kernels.<shape token>_<entry>.

(No `from __future__ import annotations`: torch.library reads the entries' annotations as types.)
"""


from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up

OPS = ("rmsnorm", "fused_add_rmsnorm", "rmsnorm_mxfp8", "fused_add_rmsnorm_mxfp8")
TIERS = ("decode", "prefill")


tier = warm_up.mode_by_tokens  # the tier of a call is its mode


def build(package: str, shape_token: str, hidden: int, kernel_variants: dict) -> SimpleNamespace:
    """The package's VARIANTS table and its four entries. `package` must export the returned VARIANTS."""
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v) for k, v in kernel_variants.items()})

    def modes(op: str) -> dict:
        return {t: [f"{op}.{t}"] for t in TIERS}

    def mode_of(x, *args, **kwargs) -> str:
        return tier(x.shape[0] if isinstance(x, torch.Tensor) and x.dim() else 0)

    def check(x, weight, residual=None) -> int:
        host.check_tokens("x", x, host.ROW_KERNEL_MAX_TOKENS)  # one descriptor per row
        host.check_tensor("x", x, dtype=torch.bfloat16, shape=(None, hidden))
        tokens = x.shape[0]
        if residual is not None:
            host.check_tensor("residual", residual, dtype=torch.bfloat16, shape=(tokens, hidden), like=x)
        host.check_tensor("weight", weight, dtype=torch.bfloat16, shape=(hidden,), like=x)
        return tokens

    def mx_outputs(x):
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        scales = torch.empty((x.shape[0], hidden // 32), dtype=torch.uint8, device=x.device)
        return q, scales

    # Each entry's checks and output allocation, shared with its fake (host.custom_op).
    def outputs_rmsnorm(x, weight, eps):
        check(x, weight)
        return torch.empty_like(x)

    def outputs_fused_add(x, residual, weight, eps):
        check(x, weight, residual)
        return torch.empty_like(x), torch.empty_like(x)

    def outputs_mx(x, weight, eps):
        check(x, weight)
        return mx_outputs(x)

    def outputs_fused_add_mx(x, residual, weight, eps):
        check(x, weight, residual)
        return (*mx_outputs(x), torch.empty_like(x))

    @warm_up.entry(table, modes("rmsnorm"), mode_of)
    def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = outputs_rmsnorm(x, weight, eps)
        if x.shape[0]:
            table[f"rmsnorm.{tier(x.shape[0])}"](x, weight, out, x.shape[0], eps, host.stream_of(x))
        return out

    @warm_up.entry(table, modes("fused_add_rmsnorm"), mode_of)
    def fused_add_rmsnorm(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, residual_out = outputs_fused_add(x, residual, weight, eps)
        tokens = x.shape[0]
        if tokens:
            table[f"fused_add_rmsnorm.{tier(tokens)}"](x, residual, weight, out, residual_out, tokens, eps, host.stream_of(x))
        return out, residual_out

    @warm_up.entry(table, modes("rmsnorm_mxfp8"), mode_of)
    def rmsnorm_mxfp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        q, scales = outputs_mx(x, weight, eps)
        tokens = x.shape[0]
        if tokens:
            table[f"rmsnorm_mxfp8.{tier(tokens)}"](x, weight, q, scales, tokens, eps, host.stream_of(x))
        return q, scales

    @warm_up.entry(table, modes("fused_add_rmsnorm_mxfp8"), mode_of)
    def fused_add_rmsnorm_mxfp8(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, scales, residual_out = outputs_fused_add_mx(x, residual, weight, eps)
        tokens = x.shape[0]
        if tokens:
            table[f"fused_add_rmsnorm_mxfp8.{tier(tokens)}"](
                x, residual, weight, q, scales, residual_out, tokens, eps, host.stream_of(x)
            )
        return q, scales, residual_out

    ns = f"amd_kernels::{shape_token}_"
    ops = dict(
        rmsnorm=host.custom_op(ns + "rmsnorm", rmsnorm, outputs_rmsnorm),
        fused_add_rmsnorm=host.custom_op(ns + "fused_add_rmsnorm", fused_add_rmsnorm, outputs_fused_add),
        rmsnorm_mxfp8=host.custom_op(ns + "rmsnorm_mxfp8", rmsnorm_mxfp8, outputs_mx),
        fused_add_rmsnorm_mxfp8=host.custom_op(
            ns + "fused_add_rmsnorm_mxfp8", fused_add_rmsnorm_mxfp8, outputs_fused_add_mx
        ),
    )
    for op in ops.values():
        op.max_tokens = host.ROW_KERNEL_MAX_TOKENS
    return SimpleNamespace(VARIANTS=table, **ops)
