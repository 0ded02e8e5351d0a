"""Host code of the MoE router packages moe/route_h<H>_e<E>_top<k> (the family's device code is route.py):
argument checks, the variant table and the torch custom op.

(No `from __future__ import annotations`: torch.library reads the entries' annotations as types.)
"""

from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up
from amd_kernels.moe import route as family_kernel


def build(package: str, hidden: int, experts: int, top_k: int, kernel=family_kernel):
    """The VARIANTS and the `route` entry of the package `package` (its `__name__`). One variant serves every
    token count: the grid is ceil(M / 16) workgroups of 16 token rows, so decode and prefill share it.
    `kernel`: the module whose `variants(hidden, experts, top_k)` builds the kernel: the family's route.py,
    or a shape's own tuned copy (its kernel.py)."""
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v)
                                           for k, v in kernel.variants(hidden, experts, top_k).items()})
    modes = {"all": ["route.all"]}

    def outputs(x, router_weight, router_bias, top_k):
        """The checks and the outputs, shared by the entry and its fake (host.custom_op)."""
        host.check_tokens("x", x, max_tokens)
        host.check_tensor("x", x, dtype=torch.bfloat16, shape=(None, hidden))
        host.check_tensor("router_weight", router_weight, dtype=torch.bfloat16, shape=(experts, hidden), like=x)
        host.check_tensor("router_bias", router_bias, dtype=torch.bfloat16, shape=(experts,), like=x)
        if top_k != globals_top_k:
            raise ValueError(f"top_k: this kernel selects {globals_top_k} experts, got {top_k}")
        return (torch.empty((x.shape[0], top_k), dtype=torch.float32, device=x.device),
                torch.empty((x.shape[0], top_k), dtype=torch.int32, device=x.device))

    @warm_up.entry(table, modes, lambda *a, **k: "all")
    def route(x: torch.Tensor, router_weight: torch.Tensor, router_bias: torch.Tensor,
              top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids = outputs(x, router_weight, router_bias, top_k)
        if x.shape[0]:
            table["route.all"](x, router_weight, router_bias, weights, ids, x.shape[0], host.stream_of(x))
        return weights, ids

    globals_top_k = top_k
    max_tokens = host.max_tokens_for(hidden * 2)  # i32 byte offsets into x [M, hidden] bf16

    op = host.custom_op(f"amd_kernels::{host.shape_token(package)}_route", route, outputs)
    op.max_tokens = max_tokens
    return SimpleNamespace(VARIANTS=table, route=op)
