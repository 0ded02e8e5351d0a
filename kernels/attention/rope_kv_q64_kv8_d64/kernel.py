"""RoPE + paged KV-cache write for 64 query / 8 KV heads of 64 (gpt-oss-120b at TP 1). Kernel:
kernels/attention/rope_kv.py; contract: references/attention.py (rope_kv_write, rope_kv_write_fp8)."""

from amd_kernels.attention import rope_kv

HQ, HKV = 64, 8
SHAPE_TOKEN = "rope_kv_q64_kv8_d64"
VARIANTS = rope_kv.variants(HQ, HKV)
