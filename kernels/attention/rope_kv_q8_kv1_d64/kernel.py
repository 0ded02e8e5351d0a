"""RoPE + paged KV-cache write for 8 query / 1 KV heads of 64 (gpt-oss-120b at TP 8). Kernel:
kernels/attention/rope_kv.py; contract: references/attention.py (rope_kv_write, rope_kv_write_fp8)."""

from amd_kernels.attention import rope_kv

HQ, HKV = 8, 1
SHAPE_TOKEN = "rope_kv_q8_kv1_d64"
VARIANTS = rope_kv.variants(HQ, HKV)
