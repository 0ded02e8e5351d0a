"""Host code of the quant/mxfp8_k<K> packages (the family's device code is mxfp8_quant.py): checks, tier by
token count, the custom op torch.ops.amd_kernels.<shape token>_mxfp8_quant.

(No `from __future__ import annotations`: torch.library reads the entry's annotations as types.)
"""

from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up
from amd_kernels.quant import mxfp8_quant as family_kernel

tier = warm_up.mode_by_tokens  # the tier of a call is its mode


def build(package: str, K: int, kernel=family_kernel) -> SimpleNamespace:
    """The entry of the package `package` (its `__name__`) for rows of K. `kernel`: the module whose
    `variants(K)` builds the kernels: the family's mxfp8_quant.py, or a shape's own tuned copy (its kernel.py)."""
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v) for k, v in kernel.variants(K).items()})
    modes = {t: [t] for t in ("decode", "prefill")}

    def outputs(x):
        """The checks and the outputs, shared by the entry and its fake (host.custom_op)."""
        host.check_tokens("x", x, host.ROW_KERNEL_MAX_TOKENS)  # one descriptor per row
        host.check_tensor("x", x, dtype=torch.bfloat16, shape=(None, K))
        return (torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device),
                torch.empty((x.shape[0], K // 32), dtype=torch.uint8, device=x.device))

    @warm_up.entry(table, modes, warm_up.mode_by_rows)
    def mxfp8_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, scales = outputs(x)
        tokens = x.shape[0]
        if tokens:
            stream = host.stream_of(x)
            table[tier(tokens)](x, q, scales, tokens, stream)
        return q, scales

    op = host.custom_op(f"amd_kernels::{host.shape_token(package)}_mxfp8_quant", mxfp8_quant, outputs)
    op.max_tokens = host.ROW_KERNEL_MAX_TOKENS  # one descriptor per row
    return SimpleNamespace(VARIANTS=table, mxfp8_quant=op)
