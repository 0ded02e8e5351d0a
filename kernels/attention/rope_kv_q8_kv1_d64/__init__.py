"""RoPE + paged KV-cache write, 8 query / 1 KV heads of 64. Entries: rope_kv_write, rope_kv_write_fp8
(torch.ops.amd_kernels.rope_kv_q8_kv1_d64_<entry>); see README.md."""

from amd_kernels.attention import rope_kv_entries
from amd_kernels.attention.rope_kv_q8_kv1_d64 import kernel

_built = rope_kv_entries.build(__name__, kernel.SHAPE_TOKEN, kernel.HQ, kernel.HKV, kernel.VARIANTS)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
rope_kv_write = _built.rope_kv_write
rope_kv_write_fp8 = _built.rope_kv_write_fp8
