"""RoPE + paged KV-cache write, 64 query / 8 KV heads of 64. Entries: rope_kv_write, rope_kv_write_fp8
(torch.ops.amd_kernels.rope_kv_q64_kv8_d64_<entry>); see README.md.
Kernel: kernels/attention/rope_kv.py; contract: references/attention.py (rope_kv_write, rope_kv_write_fp8)."""

from amd_kernels.attention import rope_kv_entries

HQ, HKV = 64, 8
_built = rope_kv_entries.build(__name__, HQ, HKV)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
rope_kv_write = _built.rope_kv_write
rope_kv_write_fp8 = _built.rope_kv_write_fp8
