"""attention/paged_q8_kv1_d64: paged attention (decode and prefill), gpt-oss-120b at TP 8 (8 query / 1 KV heads). Run:
python3 -m benchmarks.runner attention/paged_q8_kv1_d64 --tokens 1,8 --dims '{"context_lengths": [8192], "sliding_window": 0}'
(tokens = sequences of the decode batch, each holding every listed key count).
Prefill (tokens = new tokens split over prefill_sequences equal sequences, each with the cached prefix):
--tokens 4096 --dims '{"query_heads": 8, "kv_heads": 1, "prefill_sequences": 16, "prefill_uniform": true,
"cached_prefix": [0], "sliding_window": 0}'"""

from benchmarks.attention.attention_cost import flashinfer_anchors, paged_decode_cost, paged_prefill_cost

PACKAGE = "attention/paged_q8_kv1_d64"
OP = "paged_attention"
DIMS = {"query_heads": 8, "kv_heads": 1, "head_dim": 64, "sliding_window": 0, "context_lengths": [8192]}
TOKENS = (1, 8)


def cost(m: int, dims: dict = DIMS):
    return paged_prefill_cost(m, dims) if "prefill_sequences" in dims else paged_decode_cost(m, dims)


ANCHORS = flashinfer_anchors(DIMS)
