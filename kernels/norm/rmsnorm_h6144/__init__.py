"""RMSNorm family for hidden size 6144 (h6144 e128 top-4): rmsnorm, fused_add_rmsnorm and both quantized to
MXFP8.

Entries (torch.ops.amd_kernels.rmsnorm_h6144_<entry>; see README.md for arguments and outputs):
rmsnorm, fused_add_rmsnorm, rmsnorm_mxfp8, fused_add_rmsnorm_mxfp8.
"""

from amd_kernels.norm import rmsnorm_entries

H = 6144
_built = rmsnorm_entries.build(__name__, H)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
rmsnorm = _built.rmsnorm
fused_add_rmsnorm = _built.fused_add_rmsnorm
rmsnorm_mxfp8 = _built.rmsnorm_mxfp8
fused_add_rmsnorm_mxfp8 = _built.fused_add_rmsnorm_mxfp8
