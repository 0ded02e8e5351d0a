"""Wave state, lane masks and the flat view of host memory that global accesses index into."""

from __future__ import annotations

import numpy as np

WAVE = 64
FULL = (1 << 64) - 1

# Special SGPR slots in the gfx9 scalar register file (named operands map onto them).
VCC_LO, VCC_HI = 106, 107
M0 = 124
EXEC_LO, EXEC_HI = 126, 127
N_SGPR = 128
N_VGPR_FILE = 512 + 8  # unified VGPR/AGPR file (512 per lane on gfx950), a little slack

LANES = np.arange(WAVE, dtype=np.uint32)
_POW2 = (np.uint64(1) << np.arange(WAVE, dtype=np.uint64))

_mask_cache: dict[int, np.ndarray] = {}


def lane_mask(bits: int) -> np.ndarray:
    """Boolean (64,) array of the lanes set in a 64-bit mask."""
    m = _mask_cache.get(bits)
    if m is None:
        m = ((np.uint64(bits) >> np.arange(WAVE, dtype=np.uint64)) & np.uint64(1)).astype(bool)
        m.flags.writeable = False
        if len(_mask_cache) > 4096:
            _mask_cache.clear()
        _mask_cache[bits] = m
    return m


def lane_masks(bits: np.ndarray) -> np.ndarray:
    """Boolean (waves, 64) array of the lanes set in each wave's 64-bit mask, bits (waves, 1) uint64."""
    return ((np.asarray(bits, np.uint64) >> np.arange(WAVE, dtype=np.uint64)) & np.uint64(1)).astype(bool)


def pack_mask(lanes: np.ndarray) -> int:
    """64-bit integer from a boolean (64,) array."""
    return int(np.packbits(lanes, bitorder="little").view(np.uint64)[0])


class _AddressSpace:
    """Numpy arrays whose element i is host memory at byte address BASE + i*itemsize.

    Device pointers are host addresses, so global/flat/buffer accesses gather and scatter straight into
    process memory. (Base 4096 rather than 0: numpy treats a NULL data pointer as 'allocate'.)
    """
    BASE = 4096
    TOP = 1 << 47

    def __init__(self, typestr: str, itemsize: int):
        n = (self.TOP - self.BASE) // itemsize
        iface = {"data": (self.BASE, False), "shape": (n,), "typestr": typestr, "version": 3}
        self.array = np.asarray(type("_Mem", (), {"__array_interface__": iface})())


MEM8 = _AddressSpace("|u1", 1).array
MEM32 = _AddressSpace("<u4", 4).array
MEM_BASE = _AddressSpace.BASE


class Wave:
    """One wave64's architectural state. Vector registers are rows of a (N, 64) uint32 array."""

    __slots__ = ("s", "v", "scc", "pc", "done", "wave_id", "wg", "lds", "lds32", "lds_size", "launch",
                 "wg_id", "trap", "san", "slot")

    def __init__(self, wave_id: int, wg, launch, v=None):
        self.s = [0] * N_SGPR
        # v: this wave's (N, 64) slice of its workgroup's register file (engine.lockstep batches waves over it)
        self.v = np.zeros((N_VGPR_FILE, WAVE), dtype=np.uint32) if v is None else v
        self.scc = 0
        self.pc = 0
        self.done = False
        self.wave_id = wave_id
        self.wg = wg
        self.launch = launch
        self.lds = wg.lds
        self.lds32 = wg.lds32
        self.lds_size = wg.lds.size
        self.wg_id = wg.ids
        self.trap = None
        self.san = None          # sanitizer.WaveSan when a detector is on
        self.slot = wave_id      # index of its registers in the lockstep batch's register array

    @property
    def exec(self) -> int:
        return self.s[EXEC_LO] | (self.s[EXEC_HI] << 32)

    @exec.setter
    def exec(self, value: int) -> None:
        self.s[EXEC_LO] = value & 0xFFFFFFFF
        self.s[EXEC_HI] = (value >> 32) & 0xFFFFFFFF

    @property
    def vcc(self) -> int:
        return self.s[VCC_LO] | (self.s[VCC_HI] << 32)

    @vcc.setter
    def vcc(self, value: int) -> None:
        self.s[VCC_LO] = value & 0xFFFFFFFF
        self.s[VCC_HI] = (value >> 32) & 0xFFFFFFFF
