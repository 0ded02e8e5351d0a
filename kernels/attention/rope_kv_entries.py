"""Host code of the attention/rope_kv_q<Hq>_kv<Hkv>_d64 packages (the family's device code is rope_kv.py):
argument checks and the custom ops
torch.ops.amd_kernels.<shape token>_rope_kv_write (bf16 cache) and _rope_kv_write_fp8 (E4M3 cache).

One compiled variant per cache dtype serves every token count (grid = tokens). The checks need no device
sync: positions and slots are not range-checked against the cos/sin table and the cache (the caller
guarantees them; the kernel's descriptors bound every load and store to its tensor anyway).

(No `from __future__ import annotations`: torch.library reads the entries' annotations as types.)
"""

from types import SimpleNamespace

import torch

from amd_kernels import host, warm_up
from amd_kernels.attention import rope_kv as family_kernel
from amd_kernels.attention.rope_kv import BLOCK_SIZE, HEAD_DIM

MUTATES = ("key_cache", "value_cache")
# The cos/sin row's byte offset (position * 256) is an i32 of a scalar buffer load.
MAX_POSITIONS = 1 << 23


def build(package: str, hq: int, hkv: int, kernel=family_kernel) -> SimpleNamespace:
    """The entries of the package `package` (its `__name__`) for hq query / hkv KV heads. `kernel`: the module
    whose `variants(hq, hkv)` builds the kernels: the family's rope_kv.py, or a shape's own tuned copy."""
    table = warm_up.VariantTable(package, {k: warm_up.Variant(*v) for k, v in kernel.variants(hq, hkv).items()})
    width = (hq + 2 * hkv) * HEAD_DIM

    def mode_of(*args, **kwargs) -> str:
        return "all"  # one launch shape for every token count

    max_tokens = host.max_tokens_for(width * 2)  # i32 byte offsets into qkv [T, width] bf16

    def check(qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache, cache_dtype, k_scale, v_scale):
        host.check_tokens("qkv", qkv, max_tokens)
        host.check_tensor("qkv", qkv, dtype=torch.bfloat16, shape=(None, width),
                          hint=f"(Hq + 2 Hkv) * 64 = ({hq} + 2 * {hkv}) * 64 columns: q, then k, then v")
        tokens = qkv.shape[0]
        host.check_tensor("positions", positions, dtype=torch.int64, shape=(tokens,), like=qkv)
        host.check_tensor("cos_sin_cache", cos_sin_cache, dtype=torch.float32, shape=(None, HEAD_DIM), like=qkv,
                          hint="references.attention.build_cos_sin_cache: cos | sin halves")
        if not 0 < cos_sin_cache.shape[0] <= MAX_POSITIONS:
            raise ValueError(f"cos_sin_cache: expected 1..{MAX_POSITIONS} rows, got {cos_sin_cache.shape[0]}")
        host.check_tensor("slot_mapping", slot_mapping, dtype=torch.int64, shape=(tokens,), like=qkv)
        host.check_tensor("key_cache", key_cache, dtype=cache_dtype, shape=(None, BLOCK_SIZE, hkv, HEAD_DIM),
                          like=qkv, hint="vLLM's flash layout [num_blocks, block_size 64, kv heads, 64]")
        host.check_tensor("value_cache", value_cache, dtype=cache_dtype, shape=tuple(key_cache.shape), like=qkv,
                          hint="the same shape as key_cache")
        if k_scale is not None:
            host.check_tensor("k_scale", k_scale, dtype=torch.float32, shape=(1,), like=qkv)
            host.check_tensor("v_scale", v_scale, dtype=torch.float32, shape=(1,), like=qkv)
        return tokens

    # Each entry's checks and output allocation, shared with its fake (host.custom_op).
    def outputs(qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache):
        check(qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache, torch.bfloat16, None, None)
        return torch.empty((qkv.shape[0], hq, HEAD_DIM), dtype=torch.bfloat16, device=qkv.device)

    def outputs_fp8(qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache, k_scale, v_scale):
        check(qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache, torch.float8_e4m3fn,
              k_scale, v_scale)
        return torch.empty((qkv.shape[0], hq, HEAD_DIM), dtype=torch.bfloat16, device=qkv.device)

    def launch(key, q, qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache, k_scale, v_scale):
        tokens = qkv.shape[0]
        if tokens:
            # the bf16 kernel never reads the scales: any tensor fills the two arguments
            k_scale = positions if k_scale is None else k_scale
            v_scale = positions if v_scale is None else v_scale
            table[key](qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache, k_scale, v_scale, q,
                       tokens, cos_sin_cache.shape[0], host.stream_of(qkv))
        return q

    @warm_up.entry(table, {"all": ["rope_kv_write"]}, mode_of)
    def rope_kv_write(qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> torch.Tensor:
        q = outputs(qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache)
        return launch("rope_kv_write", q, qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache,
                      None, None)

    @warm_up.entry(table, {"all": ["rope_kv_write_fp8"]}, mode_of)
    def rope_kv_write_fp8(qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                          k_scale: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
        q = outputs_fp8(qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache, k_scale, v_scale)
        return launch("rope_kv_write_fp8", q, qkv, positions, cos_sin_cache, slot_mapping, key_cache, value_cache,
                      k_scale, v_scale)

    ns = f"amd_kernels::{host.shape_token(package)}_"
    ops = dict(
        rope_kv_write=host.custom_op(ns + "rope_kv_write", rope_kv_write, outputs, MUTATES),
        rope_kv_write_fp8=host.custom_op(ns + "rope_kv_write_fp8", rope_kv_write_fp8, outputs_fp8, MUTATES),
    )
    for op in ops.values():
        op.max_tokens = max_tokens
    return SimpleNamespace(VARIANTS=table, **ops)
