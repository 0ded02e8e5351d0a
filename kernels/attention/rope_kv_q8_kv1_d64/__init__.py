"""RoPE + paged KV-cache write, 8 query / 1 KV heads of 64. Entries: rope_kv_write, rope_kv_write_fp8
(torch.ops.amd_kernels.rope_kv_q8_kv1_d64_<entry>); see README.md.
Kernel: kernels/attention/rope_kv.py; contract: references/attention.py (rope_kv_write, rope_kv_write_fp8)."""

from amd_kernels.attention import rope_kv_entries

HQ, HKV = 8, 1
_built = rope_kv_entries.build(__name__, HQ, HKV)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
rope_kv_write = _built.rope_kv_write
rope_kv_write_fp8 = _built.rope_kv_write_fp8
