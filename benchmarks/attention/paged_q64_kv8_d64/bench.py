"""attention/paged_q64_kv8_d64: paged decode attention, gpt-oss-120b at TP 1 (64 query / 8 KV heads). Run:
python3 -m benchmarks.runner attention/paged_q64_kv8_d64 --tokens 1,8 --dims '{"context_lengths": [8192], "sliding_window": 0}'
(tokens = sequences of the decode batch, each holding every listed key count)."""

from benchmarks.attention.attention_cost import paged_decode_cost

PACKAGE = "attention/paged_q64_kv8_d64"
OP = "paged_attention"
DIMS = {"query_heads": 64, "kv_heads": 8, "head_dim": 64, "sliding_window": 0, "context_lengths": [8192]}
TOKENS = (1, 8)


def cost(m: int, dims: dict = DIMS):
    return paged_decode_cost(m, dims)
