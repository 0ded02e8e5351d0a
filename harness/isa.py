"""ISA cards: what a variant's gfx950 code object asks of the chip, read from the code object itself.

A card holds register counts, LDS and scratch bytes, the waves per SIMD the registers and LDS allow,
MFMA instructions by mnemonic, and any floating-point atomic. The rules every variant must pass: gfx950
target, no scratch, no floating-point atomic add (integer atomics for tickets and flags are fine).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field

from harness.emulator.codeobject import read_code_object
from harness.emulator.decoder import disassemble

GFX950_MACH = 0x4F  # EF_AMDGPU_MACH_AMDGCN_GFX950
REGISTERS_PER_LANE = 512  # per SIMD, shared by VGPRs and AGPRs
MAX_WAVES_PER_SIMD = 8
LDS_PER_CU = 160 * 1024
SIMDS_PER_CU = 4

_FP_ATOMIC = re.compile(r"^(buffer|global|flat)_atomic_(pk_)?add_(f16|bf16|f32|f64)\b")


@dataclass
class IsaCard:
    kernel: str
    arch_ok: bool
    vgprs: int
    agprs: int
    sgprs: int
    lds_bytes: int
    scratch_bytes: int
    workgroup_size: int
    waves_per_simd: int
    instructions: int
    mfma: dict = field(default_factory=dict)  # mnemonic -> static count in the code
    global_loads: dict = field(default_factory=dict)  # load mnemonic -> static count
    fp_atomics: list = field(default_factory=list)

    def violations(self) -> list[str]:
        out = []
        if not self.arch_ok:
            out.append("code object is not for gfx950")
        if self.scratch_bytes:
            out.append(f"scratch {self.scratch_bytes} bytes (register spills)")
        if self.fp_atomics:
            out.append(f"floating-point atomics: {sorted(set(self.fp_atomics))}")
        return out

    def as_dict(self) -> dict:
        return asdict(self)


def code_object_of(compiled) -> bytes:
    """The gfx950 ELF embedded in a FlyDSL CompiledFunction (MLIR prints it as an escaped string)."""
    text = compiled._keepalive._ir_text
    match = re.search(r'bin = "((?:[^"\\]|\\.)*)"', text)
    if match is None:
        raise ValueError("no gpu.binary in the compiled module")
    return _unescape_mlir(match.group(1))


def _unescape_mlir(s: str) -> bytes:
    out, i = bytearray(), 0
    while i < len(s):
        if s[i] == "\\":
            nxt = s[i + 1: i + 3]
            if re.fullmatch(r"[0-9A-Fa-f]{2}", nxt):
                out.append(int(nxt, 16))
                i += 3
                continue
            out.append(ord(s[i + 1]))
            i += 2
            continue
        out.append(ord(s[i]))
        i += 1
    return bytes(out)


def _waves_per_simd(vgprs: int, agprs: int, lds: int, wg_size: int) -> int:
    used = vgprs if agprs == 0 else -(-vgprs // 4) * 4 + agprs  # AGPRs start at a 4-aligned accum_offset
    used = max(8, -(-used // 8) * 8)  # allocation granule of 8
    by_registers = min(MAX_WAVES_PER_SIMD, REGISTERS_PER_LANE // used)
    if lds == 0:
        return by_registers
    waves_per_wg = -(-wg_size // 64)
    by_lds = (LDS_PER_CU // lds) * waves_per_wg // SIMDS_PER_CU
    return max(0, min(by_registers, by_lds))


def cards(elf: bytes) -> list[IsaCard]:
    co = read_code_object(elf)
    insts = disassemble(elf, co.digest)
    mnemonics = Counter(i.mnemonic for i in insts)
    out = []
    for k in co.kernels.values():
        meta = k.metadata
        wg = meta.get(".reqd_workgroup_size") or [meta.get(".max_flat_workgroup_size", 256), 1, 1]
        wg_size = int(wg[0]) * int(wg[1]) * int(wg[2])
        out.append(
            IsaCard(
                kernel=k.name,
                arch_ok=(co.e_flags & 0xFF) == GFX950_MACH,
                vgprs=k.vgpr_count,
                agprs=k.agpr_count,
                sgprs=k.sgpr_count,
                lds_bytes=k.group_segment_fixed_size,
                scratch_bytes=k.private_segment_fixed_size,
                workgroup_size=wg_size,
                waves_per_simd=_waves_per_simd(k.vgpr_count, k.agpr_count, k.group_segment_fixed_size, wg_size),
                instructions=len(insts),
                mfma={m: n for m, n in sorted(mnemonics.items()) if m.startswith("v_mfma")},
                global_loads={m: n for m, n in sorted(mnemonics.items()) if re.match(r"(buffer|global)_load", m)},
                fp_atomics=[m for m in mnemonics if _FP_ATOMIC.match(m)],
            )
        )
    return out
