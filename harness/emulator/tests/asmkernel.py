"""Assemble small gfx950 programs with llvm-mc-22 into loadable code objects and run them in the emulator.

Each program gets a prologue that loads its inputs with the emulator's own instructions:
  v2..v5  <- in[0..3][lane]   (dwords, 64 per row)
  s8..s11 <- in[256..259]
and an `s_endpgm`. run() returns the final state of every wave.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from harness.emulator import engine, runtime
from harness.emulator.codeobject import read_code_object
from harness.toolchain import CACHE, find_system_tool

PROLOGUE = """
  s_load_dwordx2 s[20:21], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_lshlrev_b32 v1, 2, v0
  global_load_dword v2, v1, s[20:21]
  global_load_dword v3, v1, s[20:21] offset:256
  global_load_dword v4, v1, s[20:21] offset:512
  global_load_dword v5, v1, s[20:21] offset:768
  s_load_dwordx4 s[8:11], s[20:21], 0x400
  s_waitcnt vmcnt(0) lgkmcnt(0)
"""

TEMPLATE = """
.amdgcn_target "amdgcn-amd-amdhsa--gfx950"
.text
.globl k
.p2align 8
.type k,@function
k:
{prologue}
{body}
  s_endpgm
.rodata
.p2align 6
.amdhsa_kernel k
  .amdhsa_user_sgpr_kernarg_segment_ptr 1
  .amdhsa_next_free_vgpr 256
  .amdhsa_next_free_sgpr 96
  .amdhsa_accum_offset 128
  .amdhsa_group_segment_fixed_size {lds}
  .amdhsa_system_sgpr_workgroup_id_x 1
.end_amdhsa_kernel
.amdgpu_metadata
---
amdhsa.version: [1, 2]
amdhsa.kernels:
  - .name: k
    .symbol: k.kd
    .kernarg_segment_size: 16
    .group_segment_fixed_size: {lds}
    .private_segment_fixed_size: 0
    .kernarg_segment_align: 8
    .wavefront_size: 64
    .sgpr_count: 96
    .vgpr_count: 256
    .agpr_count: 128
    .max_flat_workgroup_size: 1024
    .args:
      - {{.offset: 0, .size: 8, .value_kind: global_buffer, .address_space: global}}
      - {{.offset: 8, .size: 8, .value_kind: global_buffer, .address_space: global}}
...
.end_amdgpu_metadata
"""


def assemble(body: str, lds: int = 65536, prologue: bool = True) -> bytes:
    """Assembled and linked code object bytes (cached by source hash)."""
    src = TEMPLATE.format(prologue=PROLOGUE if prologue else "", body=body, lds=lds)
    out_dir = CACHE / "emulator" / "asm-tests"
    out_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(src.encode()).hexdigest()[:20]
    co = out_dir / f"{key}.co"
    if co.is_file():
        return co.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        s, o = Path(tmp) / "k.s", Path(tmp) / "k.o"
        s.write_text(src)
        p = subprocess.run([find_system_tool("llvm-mc"), "-triple=amdgcn-amd-amdhsa", "-mcpu=gfx950",
                            "-filetype=obj", "-o", str(o), str(s)], capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"llvm-mc failed:\n{p.stderr}")
        tmp_co = Path(tmp) / "k.co"
        subprocess.run([find_system_tool("ld.lld"), "-shared", "-o", str(tmp_co), str(o)], check=True,
                       capture_output=True, text=True)
        part = co.with_name(f"{co.name}.{os.getpid()}.tmp")
        part.write_bytes(tmp_co.read_bytes())
        part.replace(co)
    return co.read_bytes()


class Result:
    def __init__(self, waves, record, out):
        self.waves = waves
        self.record = record
        self.out = out

    @property
    def w(self):
        return self.waves[0]

    def v(self, i, wave=0):
        return self.waves[wave].v[i].copy()

    def f(self, i, wave=0):
        return self.waves[wave].v[i].view(np.float32).copy()

    def s(self, i, wave=0):
        return self.waves[wave].s[i]


def run(body: str, vin=None, sin=None, *, block=64, grid=1, lds=65536, out_words=4096, prologue=True,
        inputs: np.ndarray | None = None, options: dict | None = None) -> Result:
    """Run `body` once per wave; vin: up to 4 (64,) uint32 rows for v2..v5; sin: up to 4 ints for s8..s11."""
    buf = np.zeros(4096, np.uint32) if inputs is None else inputs
    if vin is not None:
        for i, row in enumerate(vin):
            buf[64 * i: 64 * (i + 1)] = np.asarray(row).astype(np.uint32) if np.asarray(row).dtype != np.float32 \
                else np.asarray(row, np.float32).view(np.uint32)
    if sin is not None:
        for i, x in enumerate(sin):
            buf[256 + i] = np.uint32(x & 0xFFFFFFFF)
    out = np.zeros(out_words, np.uint32)
    elf = assemble(body, lds=lds, prologue=prologue)
    co = read_code_object(elf)
    kernel = co.kernels["k"]
    program, proxy = runtime.program_for(co, "k")
    kernarg = np.zeros(64, np.uint8)
    kernarg[:8] = np.frombuffer(np.uint64(buf.ctypes.data).tobytes(), np.uint8)
    kernarg[8:16] = np.frombuffer(np.uint64(out.ctypes.data).tobytes(), np.uint8)
    waves = []
    engine.wave_end_hooks.append(waves.append)
    try:
        rec = engine.execute(program, kernel, (grid, 1, 1), (block, 1, 1), kernarg, 0, proxy, options or {})
    finally:
        engine.wave_end_hooks.remove(waves.append)
    return Result(waves, rec, out)
