"""attention/rope_kv_q8_kv1_d64: RoPE + KV-cache write, 8 / 1 heads (TP 8). Run: python3 -m benchmarks.runner attention/rope_kv_q8_kv1_d64"""

from benchmarks.attention.rope_cost import rope_cost

PACKAGE = "attention/rope_kv_q8_kv1_d64"
OP = "rope_kv_write"
DIMS = {"query_heads": 8, "kv_heads": 1, "head_dim": 64}
TOKENS = (1, 8, 64, 256)


def cost(m: int):
    return rope_cost(m, 8, 1)
