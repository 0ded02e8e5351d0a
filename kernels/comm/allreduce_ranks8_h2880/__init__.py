"""TP8 all-reduce for hidden size 2880: allreduce, allreduce_fused_add_rmsnorm, allreduce_fused_add_rmsnorm_mxfp8.

Entries (torch.ops.amd_kernels.allreduce_ranks8_h2880_<entry>; README.md has the arguments): each rank calls
with its own partial x [tokens, 2880] and gets the full result; every rank must call the same entry with the
same token count, after amd_kernels.comm.communicator.create(group) on all 8 ranks.
"""

from amd_kernels.comm import allreduce_entries
from amd_kernels.comm.allreduce_entries import (  # noqa: F401 (harness)
    TWO_STAGE_MIN_TOKENS, emulator_rows, emulator_workgroup_of_row, tier)

_built = allreduce_entries.build(__name__)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
allreduce = _built.allreduce
allreduce_fused_add_rmsnorm = _built.allreduce_fused_add_rmsnorm
allreduce_fused_add_rmsnorm_mxfp8 = _built.allreduce_fused_add_rmsnorm_mxfp8
