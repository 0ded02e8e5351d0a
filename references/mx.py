"""OCP microscaling (MX) block formats: the quantization every MX reference in this package uses.

MXFP8 (E4M3 elements, one E8M0 scale per block of 32 consecutive elements along the last dim):
- amax = max |y| over the block, y in fp32.
- scale exponent s = floor(log2(amax)) - 8, read exactly from amax's fp32 exponent field (8 is the exponent
  of E4M3's largest power of two, 448 = 1.75 * 2^8). E8M0 byte = s + 127, clamped to [0, 254]; a block whose
  amax is zero or subnormal gets byte 0.
- q = E4M3(y / 2^s): round to nearest even, saturating to +-448 (values in [448, 512) become 448).
- Special values: a NaN element becomes the E4M3 NaN code 0x7F whatever its sign. A block holding a NaN or
  +-Inf has amax exponent field 255, so its scale byte is 247 and its finite elements are scaled by 2^-120
  (to zero unless huge); +-Inf saturates to +-448, which dequantizes to +-Inf (448 * 2^120 overflows fp32),
  and 0x7F dequantizes to NaN. Subnormal fp32 inputs are kept (no flush): a block whose amax is subnormal
  gets byte 0 and its elements scale by 2^127 (those below about 2^-136 then round to zero).
- Layout: q [..., K] row-major (torch.float8_e4m3fn); scales [..., K/32] row-major (torch.uint8).
"""

from __future__ import annotations

import torch

MX_BLOCK = 32
E4M3_MAX = 448.0
E4M3_EMAX = 8


def mxfp8_quantize(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 y [..., K] (K % 32 == 0) -> (q float8_e4m3fn [..., K], scales uint8 [..., K/32])."""
    if y.shape[-1] % MX_BLOCK:
        raise ValueError(f"y: last dim {y.shape[-1]} is not a multiple of {MX_BLOCK}")
    blocks = y.float().reshape(*y.shape[:-1], y.shape[-1] // MX_BLOCK, MX_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    biased_exp = (amax.view(torch.int32) >> 23) & 0xFF  # 0 for zero and subnormal amax
    scale_byte = torch.where(biased_exp == 0, 0, (biased_exp - E4M3_EMAX).clamp(0, 254))
    # 2^-(byte-127) built from bits, exact for every byte in [0, 254]
    inv_scale = torch.ldexp(torch.ones_like(amax), (127 - scale_byte).to(torch.float32))
    scaled = (blocks * inv_scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
    codes = torch.where(torch.isnan(scaled), torch.tensor(0x7F, dtype=torch.uint8), codes)  # NaN: 0x7F, any sign
    q = codes.view(torch.float8_e4m3fn).reshape(y.shape)
    return q, scale_byte.to(torch.uint8)


def mxfp8_dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(q float8_e4m3fn [..., K], scales uint8 [..., K/32]) -> fp32 [..., K]."""
    k = q.shape[-1]
    blocks = q.float().reshape(*q.shape[:-1], k // MX_BLOCK, MX_BLOCK)
    scale = torch.ldexp(torch.ones(scales.shape, dtype=torch.float32), scales.to(torch.float32) - 127)
    return (blocks * scale.unsqueeze(-1)).reshape(q.shape)
