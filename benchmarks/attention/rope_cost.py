"""The minimum traffic of rope_kv_write at m tokens: qkv read once, q written once, k and v written once
to the cache, the cos/sin row of each token's position read once (the builder's positions are distinct
in practice), and each token's position and slot (int64) read once. No FLOP floor worth stating (6 fp32
ops per element)."""

from benchmarks.runner import Cost


def rope_cost(m: int, hq: int, hkv: int, cache_bytes: int = 2) -> Cost:
    head = 64
    qkv = m * (hq + 2 * hkv) * head * 2
    q = m * hq * head * 2
    kv = m * 2 * hkv * head * cache_bytes
    cos_sin = m * head * 4
    meta = m * 16
    return Cost(min_bytes=qkv + q + kv + cos_sin + meta, flops=m * (hq + hkv) * head * 3, min_mfma=0,
                min_write_bytes=q + kv)
