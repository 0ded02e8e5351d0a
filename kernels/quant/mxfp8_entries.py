"""Host code shared by the quant/mxfp8_k<K> packages: checks, tier by token count, the custom op
torch.ops.amd_kernels.<shape token>_mxfp8_quant.

(No `from __future__ import annotations`: torch.library reads the entry's annotations as types.)
"""

from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up

tier = warm_up.mode_by_tokens  # the tier of a call is its mode


def build(package: str, shape_token: str, K: int, kernel_variants: dict) -> SimpleNamespace:
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v) for k, v in kernel_variants.items()})
    modes = {t: [t] for t in ("decode", "prefill")}

    def mode_of(x, *args, **kwargs) -> str:
        return tier(x.shape[0] if isinstance(x, torch.Tensor) and x.dim() else 0)

    def outputs(x):
        """The checks and the outputs, shared by the entry and its fake (host.custom_op)."""
        host.check_tokens("x", x, host.ROW_KERNEL_MAX_TOKENS)  # one descriptor per row
        host.check_tensor("x", x, dtype=torch.bfloat16, shape=(None, K))
        return (torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device),
                torch.empty((x.shape[0], K // 32), dtype=torch.uint8, device=x.device))

    @warm_up.entry(table, modes, mode_of)
    def mxfp8_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, scales = outputs(x)
        tokens = x.shape[0]
        if tokens:
            stream = host.stream_of(x)
            table[tier(tokens)](x, q, scales, tokens, stream)
        return q, scales

    op = host.custom_op(f"amd_kernels::{shape_token}_mxfp8_quant", mxfp8_quant, outputs)
    op.max_tokens = host.ROW_KERNEL_MAX_TOKENS  # one descriptor per row
    return SimpleNamespace(VARIANTS=table, mxfp8_quant=op)
