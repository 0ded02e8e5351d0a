"""Cross-lane data movement patterns: DPP controls, ds_swizzle offsets, SDWA selections."""

from __future__ import annotations

import re

import numpy as np

from .state import WAVE

_L = np.arange(WAVE)


def dpp_source_lanes(mods: dict) -> np.ndarray:
    """Source lane of each lane for a DPP control (-1 where the source is out of range)."""
    row, pos = _L & ~15, _L & 15
    if "quad_perm" in mods:
        sel = [int(x) for x in mods["quad_perm"].strip("[]").split(",")]
        return (_L & ~3) | np.array(sel)[_L & 3]
    for key in ("row_shl", "row_shr", "row_ror", "row_newbcast", "row_bcast", "wave_shl", "wave_shr", "wave_rol",
                "wave_ror"):
        if key in mods:
            n = int(mods[key], 0)
            break
    else:
        if "row_mirror" in mods:
            return row | (15 - pos)
        if "row_half_mirror" in mods:
            return (_L & ~7) | (7 - (_L & 7))
        raise ValueError(f"unknown DPP control in {mods}")
    if key == "row_shl":
        return np.where(pos + n <= 15, _L + n, -1)
    if key == "row_shr":
        return np.where(pos - n >= 0, _L - n, -1)
    if key == "row_ror":
        return row | ((pos - n) & 15)
    if key == "row_newbcast":
        return row | n
    if key == "row_bcast":
        if n == 15:
            return np.where(row > 0, row - 1, -1)
        if n == 31:
            return np.where(_L >= 32, 31, -1)
    if key == "wave_shl":
        return np.where(_L + 1 < WAVE, _L + 1, -1)
    if key == "wave_shr":
        return np.where(_L >= 1, _L - 1, -1)
    if key == "wave_rol":
        return (_L + 1) % WAVE
    if key == "wave_ror":
        return (_L - 1) % WAVE
    raise ValueError(f"unknown DPP control {key}:{n}")


def dpp_write_lanes(mods: dict) -> np.ndarray:
    """Lanes row_mask/bank_mask allow to be written."""
    row_mask = int(mods.get("row_mask", "0xf"), 0)
    bank_mask = int(mods.get("bank_mask", "0xf"), 0)
    return (((row_mask >> (_L >> 4)) & 1) & ((bank_mask >> ((_L & 15) >> 2)) & 1)).astype(bool)


def swizzle_source_lanes(offset_text: str) -> np.ndarray:
    """Source lane per lane for ds_swizzle_b32's offset (symbolic swizzle(...) or a number)."""
    m = re.match(r"swizzle\((\w+)(?:,(.*))?\)$", offset_text)
    if m:
        mode, args = m.group(1), [a.strip() for a in (m.group(2) or "").split(",") if a.strip()]
        if mode == "QUAD_PERM":
            sel = [int(a) for a in args]
            return (_L & ~3) | np.array(sel)[_L & 3]
        if mode == "SWAP":
            return _bitmask(0x1F, 0, int(args[0]))
        if mode == "REVERSE":
            return _bitmask(0x1F, 0, int(args[0]) - 1)
        if mode == "BROADCAST":
            size, lane = int(args[0]), int(args[1])
            return _bitmask(0x1F & ~(size - 1), lane, 0)
        if mode == "BITMASK_PERM":
            pat = args[0].strip('"')
            and_m = or_m = xor_m = 0
            for i, ch in enumerate(reversed(pat)):
                bit = 1 << i
                if ch == "1":
                    or_m |= bit
                elif ch == "p":
                    and_m |= bit
                elif ch == "i":
                    and_m |= bit
                    xor_m |= bit
            return _bitmask(and_m, or_m, xor_m)
        raise ValueError(f"unknown swizzle mode {mode}")
    off = int(offset_text, 0)
    if off & 0x8000:
        sel = [(off >> (2 * i)) & 3 for i in range(4)]
        return (_L & ~3) | np.array(sel)[_L & 3]
    return _bitmask(off & 0x1F, (off >> 5) & 0x1F, (off >> 10) & 0x1F)


def _bitmask(and_m, or_m, xor_m):
    """BitMode swizzle: within each group of 32 lanes, src = ((lane & and) | or) ^ xor."""
    return (_L & 32) | ((((_L & 31) & and_m) | or_m) ^ xor_m)


SDWA_SEL = {"BYTE_0": (0, 8), "BYTE_1": (8, 8), "BYTE_2": (16, 8), "BYTE_3": (24, 8),
            "WORD_0": (0, 16), "WORD_1": (16, 16), "DWORD": (0, 32)}
