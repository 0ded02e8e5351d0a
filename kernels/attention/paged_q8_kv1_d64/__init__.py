"""Paged attention (decode and prefill tiers) for 8 query / 1 KV heads, head_dim 64. Entries: paged_attention(...) (bf16 KV
cache, both tiers), paged_attention_fp8(..., k_scale, v_scale) (E4M3 cache, decode tier); see README.md."""

from amd_kernels.attention import paged_entries
from amd_kernels.attention.paged_q8_kv1_d64 import kernel

_built = paged_entries.build(__name__, kernel.SHAPE_TOKEN, kernel.KV_HEADS, kernel.MAX_SPLITS,
                             kernel.MIN_SPLIT_BLOCKS, kernel.VARIANTS)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
paged_attention = _built.paged_attention
paged_attention_fp8 = _built.paged_attention_fp8
emulator_workgroups = _built.emulator_workgroups
