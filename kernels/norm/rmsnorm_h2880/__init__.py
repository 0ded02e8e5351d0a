"""RMSNorm family for hidden size 2880 (gpt-oss-120b, TP 1 and 8): rmsnorm, fused_add_rmsnorm and both
quantized to MXFP8.

Entries (torch.ops.amd_kernels.rmsnorm_h2880_<entry>; see README.md for arguments and outputs):
rmsnorm, fused_add_rmsnorm, rmsnorm_mxfp8, fused_add_rmsnorm_mxfp8.
"""

from amd_kernels.norm import rmsnorm_entries

H = 2880
_built = rmsnorm_entries.build(__name__, H)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
rmsnorm = _built.rmsnorm
fused_add_rmsnorm = _built.fused_add_rmsnorm
rmsnorm_mxfp8 = _built.rmsnorm_mxfp8
fused_add_rmsnorm_mxfp8 = _built.fused_add_rmsnorm_mxfp8
