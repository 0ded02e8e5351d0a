"""Projected MI355X time of an emulated launch: a cost model, not a measurement.

    from benchmarks import costmodel
    with emulator.launches() as recs:
        entry(**inputs)
    us = costmodel.project_records(recs)["us"]          # always label it "projected"

Per launch, from the emulator's counters (instructions by class, MFMAs by mnemonic, global bytes issued and
distinct, LDS bytes and bank conflicts, waits, workgroups and waves; sampled launches are scaled per workgroup)
and the kernel's code object (VGPRs, AGPRs, LDS: the waves per SIMD they allow):

  busiest CU      ceil(workgroups / 256) workgroups (the tail), their waves round-robin on the 4 SIMDs;
  issue           per SIMD, the largest of 4 cycles per VALU / SALU / VMEM / LDS wave-instruction (one issue
                  per type per SIMD every 4 cycles) and the MFMA pipe's cycles (FLOPs / the form's rate);
  latency         rounds of resident waves (occupancy) x each wave's serial time: 4 cycles per instruction
                  plus an exposed wait per s_waitcnt and per s_barrier (fitted) - what decides launches with
                  few waves in flight and shallow load pipelines;
  LDS             bytes / 128 B per clock per CU plus the bank-conflict cycles;
  CU memory       global bytes the busiest CU issues / what a CU sustains (fitted; peak 64 B per clock);
  chip memory     distinct bytes (DRAM-like) / HBM 8 TB/s x a fitted efficiency; bytes issued / the L2's;
  launch          time = the largest term + a fitted share of the second (imperfect overlap) + a fitted
                  per-launch cost inside a graph (launch gap, ramp, first-wave latency).

The fitted constants come from benchmarks/calibrate.py (published MI355X timings of FlyDSL kernels emulated
here at the same shapes); the calibration table and its error are in benchmarks/README.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, asdict

# ---------------------------------------------------------------------------------------------- the chip
# Published figures (sources in benchmarks/calibration_points.csv's header and benchmarks/README.md).
CLOCK_HZ = 2.4e9            # AMD Instinct MI355X product page: peak engine clock 2400 MHz
CUS = 256                   # idem: 256 compute units (8 XCDs x 32)
SIMDS_PER_CU = 4            # CDNA3/CDNA4 ISA guides: 4 SIMDs per CU
MAX_WAVES_PER_SIMD = 8      # harness/isa.py (gfx950 wave slots per SIMD)
REGISTERS_PER_LANE = 512    # VGPRs + AGPRs per lane per SIMD (CDNA3 ISA guide, unified register file)
LDS_PER_CU = 160 * 1024     # CDNA4 whitepaper: 160 KB LDS per CU
HBM_BYTES_PER_S = 8e12      # MI355X product page: 8 TB/s HBM3E
LLC_BYTES = 256 << 20       # MI355X product page: 256 MB Infinity Cache (not modelled: inputs rotate past it)
ISSUE_CYCLES = 4            # GCN/CDNA: a SIMD issues one instruction per type every 4 cycles (16-lane SIMD, wave64)
LDS_BYTES_PER_CLK_CU = 128  # CDNA3 whitepaper: 128 B/clk LDS bandwidth per CU (UNSURE for gfx950's wider reads)
L2_BYTES_PER_CLK_CU_PEAK = 64  # CDNA3 whitepaper: 64 B/clk per CU from L2 (the fitted figure below is what a CU sustains)
L2_BYTES_PER_CLK_XCD = 2048  # CDNA3 whitepaper: L2 128 B/clk x 16 channels per XCD; 8 XCDs
XCDS = 8
# Multi-GPU: AMD's MI355X specification, 7 xGMI links per GPU at 153.6 GB/s bidirectional (76.8 GB/s each
# way), 8 GPUs fully connected (kernels/comm/allreduce_ranks8_h2880/README.md quotes it). No published per-hop
# latency: the flag round trips are in the fitted launch cost and the emulated spin loops.
XGMI_LINKS = 7
XGMI_BYTES_PER_S = 76.8e9   # per link, one direction
# Dense MFMA FLOP per clock per CU by operand type (MI355X product page peaks / (256 CUs x 2.4 GHz)):
# FP8 5.0 PFLOP/s -> 8192; FP16/BF16 2.5 -> 4096; MXFP6/MXFP4 10 -> 16384; FP32 MFMA 157 TFLOP/s -> 256;
# INT8 5.0 POPS -> 8192; FP64 MFMA 78.6 -> 128. The CDNA3-era FP8 forms (16x16x32 fp8_fp8) run at the CDNA3
# per-CU rate (MI300X 2.6 PFLOP/s / 304 CUs / 2.1 GHz -> 4096).
MFMA_FLOP_PER_CLK_CU = {"f8f6f4": 8192, "fp4": 16384, "bf16": 4096, "f16": 4096, "fp8_legacy": 4096,
                        "i8": 8192, "f32": 256, "xf32": 1024, "f64": 128}


@dataclass
class Fitted:
    """Constants fitted by benchmarks/calibrate.py (see benchmarks/README.md for the table and its error)."""
    launch_us: float = 2.0      # per launch inside a graph: gap, dispatch ramp, first loads, last stores
    wait_cycles: float = 300.0  # exposed cycles per s_waitcnt of a wave when its SIMD has nothing else to run
    barrier_cycles: float = 0.0  # exposed cycles per s_barrier (a pipeline stage that waits for its loads)
    hbm_efficiency: float = 0.8  # fraction of 8 TB/s a streaming kernel reaches
    overlap: float = 0.3        # share of the second-largest term that does not overlap the largest
    cu_bytes_per_clk: float = 64.0  # global bytes one CU sustains per clock (peak 64: L2_BYTES_PER_CLK_CU_PEAK)


FITTED = Fitted()  # replaced by calibrate.py's output below when present
try:  # the last calibration's constants, written by `python -m benchmarks.calibrate --write`
    from benchmarks.costmodel_fit import FIT as _FIT

    FITTED = Fitted(**_FIT)
except ImportError:  # pragma: no cover - before the first calibration
    pass


_MFMA_SHAPE = re.compile(r"v_(?:s)?mfma_(?:scale_)?[a-z0-9]+_(\d+)x(\d+)x(\d+)(?:x\d+)?_?([a-z0-9_]*)")


def mfma_cycles(mnemonic: str, fp4: bool = False) -> float:
    """SIMD cycles of one MFMA: its FLOPs over the per-SIMD rate of its operand type."""
    m = _MFMA_SHAPE.match(mnemonic)
    if not m:
        return 16.0
    M, N, K, kind = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
    flops = 2 * M * N * K
    if "f8f6f4" in kind:
        rate = MFMA_FLOP_PER_CLK_CU["fp4" if fp4 else "f8f6f4"]
    elif "fp8" in kind or "bf8" in kind:
        rate = MFMA_FLOP_PER_CLK_CU["fp8_legacy"]
    elif "bf16" in kind:
        rate = MFMA_FLOP_PER_CLK_CU["bf16"]
    elif "f16" in kind:
        rate = MFMA_FLOP_PER_CLK_CU["f16"]
    elif "i8" in kind:
        rate = MFMA_FLOP_PER_CLK_CU["i8"]
    elif "xf32" in kind:
        rate = MFMA_FLOP_PER_CLK_CU["xf32"]
    elif "f64" in kind:
        rate = MFMA_FLOP_PER_CLK_CU["f64"]
    else:
        rate = MFMA_FLOP_PER_CLK_CU["f32"]
    return max(4.0, flops / (rate / SIMDS_PER_CU))


def waves_per_simd(vgprs: int, agprs: int, lds: int, wg_size: int) -> int:
    """Occupancy: waves per SIMD the registers and LDS allow (as harness/isa.py computes it)."""
    used = vgprs if agprs == 0 else -(-vgprs // 4) * 4 + agprs
    used = max(8, -(-used // 8) * 8)
    by_regs = min(MAX_WAVES_PER_SIMD, REGISTERS_PER_LANE // used)
    if lds <= 0:
        return by_regs
    waves_per_wg = -(-wg_size // 64)
    by_lds = (LDS_PER_CU // lds) * waves_per_wg // SIMDS_PER_CU
    return max(1, min(by_regs, by_lds))


def kernel_resources(kernel_name: str) -> dict:
    """VGPRs, AGPRs and static LDS of a kernel the emulator has loaded (read from its code object)."""
    from harness.emulator import runtime

    for co in list(runtime._modules.values()):
        k = co.kernels.get(kernel_name)
        if k is not None:
            return {"vgprs": k.vgpr_count, "agprs": k.agpr_count, "lds_bytes": k.group_segment_fixed_size}
    return {"vgprs": 128, "agprs": 0, "lds_bytes": 0}


def launch_from_record(rec, fp4: bool = False) -> dict:
    """The model's input for one LaunchRecord (call it while the kernel's module is still loaded)."""
    wgs = int(rec.grid[0]) * int(rec.grid[1]) * int(rec.grid[2])
    c = rec.counters
    ran = len(rec.workgroups_executed) if rec.workgroups_executed is not None else wgs
    d = {"kernel": rec.kernel_name, "workgroups": wgs, "wg_size": int(rec.block[0]) * int(rec.block[1]) * int(rec.block[2]),
         "ran": ran, "counters": {k: v for k, v in c.items() if k not in ("instructions", "mfma")},
         "instructions": dict(c.get("instructions", {})), "mfma": dict(c.get("mfma", {})), "fp4": fp4,
         "sampled": rec.workgroups_executed is not None}
    d.update(kernel_resources(rec.kernel_name))
    return d


def project_launch(L: dict, dram_bytes: float | None = None, fit: Fitted | None = None,
                   link_bytes: float = 0) -> dict:
    """Projected microseconds of one launch (dict from launch_from_record) and the terms behind it.

    dram_bytes: the launch's DRAM bytes when the caller knows better (a sampled launch has no distinct count);
    default: distinct bytes loaded + stored, or for a sampled launch the issued bytes scaled to the grid.
    link_bytes: bytes this rank's launch pulls from its peers over xGMI (multi-rank kernels; the emulator
    does not tell local from remote addresses, so the caller says): the "xgmi" term, the 7 links in parallel.
    They also stay in the HBM term (a peer's HBM serves them)."""
    fit = fit or FITTED
    c, ins = L["counters"], L["instructions"]
    ran = max(1, L["ran"])
    wgs = L["workgroups"]
    waves_ran = max(1, c.get("waves", ran * -(-L["wg_size"] // 64)))
    wpw = -(-L["wg_size"] // 64)                              # waves per workgroup
    per_wave = {k: v / waves_ran for k, v in ins.items()}
    mfma_cyc_wave = sum(n * mfma_cycles(m, L.get("fp4", False)) for m, n in L["mfma"].items()) / waves_ran
    n_instr_wave = sum(per_wave.values())

    occ = L.get("waves_per_simd_override") or waves_per_simd(L["vgprs"], L["agprs"], L["lds_bytes"], L["wg_size"])
    wg_per_cu_max = max(1, (occ * SIMDS_PER_CU) // wpw)       # resident workgroups per CU
    wg_cu = math.ceil(wgs / CUS)                              # the busiest CU's workgroups (tail included)
    waves_cu = wg_cu * wpw
    waves_simd = math.ceil(waves_cu / SIMDS_PER_CU)          # waves one SIMD runs over the launch
    resident_simd = max(1, min(waves_simd, math.ceil(min(wg_cu, wg_per_cu_max) * wpw / SIMDS_PER_CU)))
    rounds = math.ceil(waves_simd / resident_simd)

    cyc = ISSUE_CYCLES
    issue = max(cyc * waves_simd * per_wave.get("valu", 0) + cyc * waves_simd * per_wave.get("vopc", 0),
                cyc * waves_simd * (per_wave.get("salu", 0) + per_wave.get("branch", 0)),
                cyc * waves_simd * per_wave.get("vmem", 0),
                cyc * waves_simd * per_wave.get("lds", 0),
                waves_simd * mfma_cyc_wave)
    serial = cyc * n_instr_wave + max(0.0, mfma_cyc_wave - cyc * per_wave.get("mfma", 0)) / max(1, resident_simd) \
        + fit.wait_cycles * per_wave.get("waitcnt", 0) + fit.barrier_cycles * per_wave.get("barrier", 0)
    latency = rounds * serial

    per_wg = {k: c.get(k, 0) / ran for k in ("global_load_bytes", "global_store_bytes", "global_atomic_bytes",
                                               "lds_read_bytes", "lds_write_bytes", "lds_bank_conflicts",
                                               "global_load_distinct_bytes", "global_store_distinct_bytes")}
    issued_wg = per_wg["global_load_bytes"] + per_wg["global_store_bytes"] + per_wg["global_atomic_bytes"]
    lds = wg_cu * ((per_wg["lds_read_bytes"] + per_wg["lds_write_bytes"]) / LDS_BYTES_PER_CLK_CU
                   + per_wg["lds_bank_conflicts"] / SIMDS_PER_CU)
    cu_mem = wg_cu * issued_wg / fit.cu_bytes_per_clk
    terms_cyc = {"issue": issue, "latency": latency, "lds": lds, "cu_memory": cu_mem}
    terms = {k: v / CLOCK_HZ * 1e6 for k, v in terms_cyc.items()}

    if dram_bytes is None:
        if L.get("sampled"):
            dram_bytes = issued_wg * wgs
        else:
            dram_bytes = c.get("global_load_distinct_bytes", 0) + c.get("global_store_distinct_bytes", 0)
    terms["hbm"] = dram_bytes / (HBM_BYTES_PER_S * fit.hbm_efficiency) * 1e6
    terms["l2"] = issued_wg * wgs / (L2_BYTES_PER_CLK_XCD * XCDS * CLOCK_HZ) * 1e6
    if link_bytes:
        terms["xgmi"] = link_bytes / (XGMI_LINKS * XGMI_BYTES_PER_S) * 1e6
    ordered = sorted(terms.values(), reverse=True)
    body = ordered[0] + fit.overlap * ordered[1]
    us = fit.launch_us + body
    bound = max(terms, key=terms.get)
    return {"us": us, "bound": bound, "terms_us": terms, "waves_per_simd": occ, "workgroups_per_cu": wg_cu,
            "resident_waves_per_simd": resident_simd, "rounds": rounds, "dram_bytes": dram_bytes}


def project_launches(launches: list[dict], dram_bytes: list | None = None, fit: Fitted | None = None,
                     link_bytes: list | None = None) -> dict:
    """Sum over an entry's launches (each launch pays its own per-launch cost: they run back to back)."""
    outs = [project_launch(L, None if dram_bytes is None else dram_bytes[i], fit,
                           0 if link_bytes is None else link_bytes[i]) for i, L in enumerate(launches)]
    return {"us": sum(o["us"] for o in outs), "launches": outs}


def project_records(recs, fp4: bool = False, fit: Fitted | None = None, link_bytes: float = 0) -> dict:
    """`link_bytes`: bytes the entry pulls from peer ranks, charged to its first launch (see project_launch)."""
    launches = [launch_from_record(r, fp4) for r in recs]
    links = [link_bytes if i == 0 else 0 for i in range(len(launches))]
    return project_launches(launches, fit=fit, link_bytes=links)


def fitted_dict(fit: Fitted | None = None) -> dict:
    return asdict(fit or FITTED)
