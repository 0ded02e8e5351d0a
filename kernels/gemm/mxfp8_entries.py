"""Host code shared by the MXFP8 GEMM packages gemm/mxfp8_n<N>_k<K> (one package per weight shape).

Each package's kernel.py lists its tiers (tile and waves per workgroup per token range) and builds `VARIANTS`;
this module checks arguments, allocates the output, picks the tier by token count (one launch), and
registers the entry as the torch custom op torch.ops.amd_kernels.<shape token>_mxfp8_gemm.

(No `from __future__ import annotations`: torch.library reads the entry's annotations as types.)
"""

from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up
from amd_kernels.gemm import mxfp8_gemm


def build(package: str, shape_token: str, N: int, K: int, tiers: dict, kernel_variants: dict) -> SimpleNamespace:
    """`tiers`: name -> mxfp8_gemm.Tier in increasing max_tokens order (the last serves any M)."""
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v) for k, v in kernel_variants.items()})
    ordered = list(tiers.items())
    KB, STEPS = K // 32, mxfp8_gemm.steps(K)

    def tier_of(tokens: int) -> str:
        for name, t in ordered:
            if tokens <= t.max_tokens:
                return name
        return ordered[-1][0]

    modes = {
        "decode": sorted({tier_of(m) for m in range(1, warm_up.DECODE_MAX_TOKENS + 1)}),
        "prefill": [ordered[-1][0]],
    }

    _NOT_PREPARED = "a checkpoint-layout weight? pass it through prepare_weights() once at load time"

    def mode_of(x, *args, **kwargs) -> str:
        tokens = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() else 0
        return warm_up.mode_by_tokens(tokens)

    def weight_hint(t, want: tuple, k_of) -> str:
        """Why a weight's shape is wrong: packed for another N or K (another package's weight), or not packed."""
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[2] != want[2]:
            return _NOT_PREPARED
        other = []
        if t.shape[0] != want[0]:
            other.append(f"N = {t.shape[0] * 16}")
        if t.shape[1] != want[1]:
            other.append(f"K = {k_of(t.shape[1])}" if k_of else "another K")
        if not other:
            return ""
        return (f"packed by prepare_weights() for a weight of {' and '.join(other)}, but this package "
                f"({shape_token}) serves N = {N}, K = {K}: use the package of that shape")

    # i32 byte offsets into x [M, K] and out [M, N] bf16, masked stores at host.OOB_OFFSET
    max_tokens = host.max_tokens_for(max(K, 2 * N))

    def check(x, x_scales, w_packed, w_scales_packed, bias) -> int:
        host.check_tokens("x", x, max_tokens)
        host.check_tensor("x", x, dtype=torch.float8_e4m3fn, shape=(None, K))
        tokens = x.shape[0]
        # x_scales is read one byte at a time, so any byte offset (a row slice) is fine.
        host.check_tensor("x_scales", x_scales, dtype=torch.uint8, shape=(tokens, KB), like=x, align=1)
        host.check_tensor("w_packed", w_packed, dtype=torch.float8_e4m3fn, shape=(N // 16, K // 64, 1024), like=x,
                          hint=lambda: weight_hint(w_packed, (N // 16, K // 64, 1024), lambda kk: kk * 64))
        host.check_tensor("w_scales_packed", w_scales_packed, dtype=torch.uint8, shape=(N // 16, STEPS, 64),
                          like=x, hint=lambda: weight_hint(w_scales_packed, (N // 16, STEPS, 64), None))
        host.check_tensor("bias", bias, dtype=torch.bfloat16, shape=(N,), like=x)
        return tokens

    def outputs(x, x_scales, w_packed, w_scales_packed, bias):
        """The checks and the output, shared by the entry and its fake (host.custom_op)."""
        tokens = check(x, x_scales, w_packed, w_scales_packed, bias)
        return torch.empty((tokens, N), dtype=torch.bfloat16, device=x.device)

    @warm_up.entry(table, modes, mode_of)
    def mxfp8_gemm_entry(
        x: torch.Tensor, x_scales: torch.Tensor, w_packed: torch.Tensor, w_scales_packed: torch.Tensor,
        bias: torch.Tensor,
    ) -> torch.Tensor:
        out = outputs(x, x_scales, w_packed, w_scales_packed, bias)
        tokens = x.shape[0]
        if tokens:
            table[tier_of(tokens)](x, x_scales, w_packed, w_scales_packed, bias, out, tokens, host.stream_of(x))
        return out

    mxfp8_gemm_entry.__name__ = "mxfp8_gemm"


    def prepare(inputs: dict) -> dict:
        """Reference inputs (checkpoint layout) -> entry inputs (packed weights); run once at load time."""
        w_packed, w_scales_packed = mxfp8_gemm.prepare_weights(inputs["w"], inputs["w_scales"])
        return {"x": inputs["x"], "x_scales": inputs["x_scales"], "w_packed": w_packed,
                "w_scales_packed": w_scales_packed, "bias": inputs["bias"]}

    op = host.custom_op(f"amd_kernels::{shape_token}_mxfp8_gemm", mxfp8_gemm_entry, outputs)
    op.max_tokens = max_tokens
    return SimpleNamespace(VARIANTS=table, tier_of=tier_of, prepare=prepare, mxfp8_gemm=op, max_tokens=max_tokens)


# Set to 1 (before import) to let each tier sum K in its own split, as before issue 19: a few percent fewer
# instructions in the tiers that run several K chunks in one wave, and fewer VGPRs, but a row's bits then
# depend on the token count (not batch invariant). Unset: every tier sums in the package's CHUNK_STEPS.
BATCH_VARIANT_ENV = "AMD_KERNELS_GEMM_BATCH_VARIANT"


def variants(N: int, K: int, shape_token: str, tiers: dict, chunk: int | None = None) -> dict:
    """kernel.py's VARIANTS: tier name -> (launcher, example-args function) for warm-up. `chunk`: 128-K steps
    per K chunk, shared by every tier (mxfp8_gemm.build); ignored under BATCH_VARIANT_ENV=1."""
    import os

    import flydsl.expr as fx

    if os.environ.get(BATCH_VARIANT_ENV, "") == "1":
        chunk = None
    out = {}
    for name, tier in tiers.items():
        launcher = mxfp8_gemm.build(N, K, f"{shape_token.split('_', 1)[1]}_{name}", tier, chunk)

        def example(m: int = 1):
            return (torch.zeros(m, K, dtype=torch.float8_e4m3fn), torch.zeros(m, K // 32, dtype=torch.uint8),
                    torch.zeros(N // 16, K // 64, 1024, dtype=torch.float8_e4m3fn),
                    torch.zeros(N // 16, mxfp8_gemm.steps(K), 64, dtype=torch.uint8),
                    torch.zeros(N, dtype=torch.bfloat16), torch.zeros(m, N, dtype=torch.bfloat16), m,
                    fx.Stream(None))

        out[name] = (launcher, example)
    return out
