"""Paged attention (decode and prefill tiers), 8 query / 1 KV heads, head_dim 64, bf16 cache (gpt-oss-120b at TP 8).
Kernels: kernels/attention/paged_decode.py, paged_prefill.py; contract: references/attention.py (paged_attention)."""

from amd_kernels.attention import paged_entries

SHAPE_TOKEN = "paged_q8_kv1_d64"
KV_HEADS = 1
# Split over keys (full-attention layers): at most MAX_SPLITS splits of at least MIN_SPLIT_BLOCKS 64-key
# blocks, a function of the sequence's own length only.
MAX_SPLITS = 128
MIN_SPLIT_BLOCKS = 8
VARIANTS = paged_entries.variants(KV_HEADS, MAX_SPLITS, MIN_SPLIT_BLOCKS)
