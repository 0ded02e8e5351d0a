"""Paged attention (decode and prefill tiers) for 64 query / 8 KV heads, head_dim 64. Entries: paged_attention(...) (bf16 KV
cache, both tiers), paged_attention_fp8(..., k_scale, v_scale) (E4M3 cache, decode tier); see README.md.
Kernels: kernels/attention/paged_decode.py, paged_prefill.py; contract: references/attention.py (paged_attention)."""

from amd_kernels import host
from amd_kernels.attention import paged_entries

KV_HEADS = 8
# Split over keys (full-attention layers): at most MAX_SPLITS splits of at least MIN_SPLIT_BLOCKS 64-key
# blocks, a function of the sequence's own length only.
MAX_SPLITS = 32
MIN_SPLIT_BLOCKS = 8
_built = paged_entries.build(__name__, host.shape_token(__name__), KV_HEADS, MAX_SPLITS, MIN_SPLIT_BLOCKS,
                             paged_entries.variants(KV_HEADS, MAX_SPLITS, MIN_SPLIT_BLOCKS))
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
paged_attention = _built.paged_attention
paged_attention_fp8 = _built.paged_attention_fp8
emulator_workgroups = _built.emulator_workgroups
release_workspaces = _built.release_workspaces  # the split workspace, allocated again by the next call
