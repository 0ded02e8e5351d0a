"""The checks every kernel entry passes at every regime token count.

- cosine of each result against the reference >= the op's threshold (real rows only);
- bitwise determinism: a second run gives the same bytes (under the emulator, with another workgroup order);
- padding rows harmless: garbage in the graph-padding rows leaves the real rows' bytes unchanged;
- no compile after warm-up (compile_watch records every FlyDSL trace).
On the emulator, large launches of kernels whose workgroups each own a block of rows execute a seeded
sample of workgroups; then only the rows those workgroups own are checked, and the result says so.
"""

from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass, field

import torch

from harness import device as devices
from references import OPS, cosine

# On the emulator, launches with more workgroups than this run a sample of this many.
EMULATOR_SAMPLE_WORKGROUPS = 16


def seed_of(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def fill_padding(inputs: dict, row_inputs: tuple, real: int, garbage: bool) -> dict:
    """Rows real.. of the token-row inputs: garbage (NaN, +-65504, 1e4-scale noise) or zeros."""
    out = dict(inputs)
    for name in row_inputs:
        t = inputs[name].clone()
        pad = t[real:]
        if pad.numel():
            if garbage:
                noise = torch.randn(pad.shape, generator=torch.Generator().manual_seed(real)) * 1e4
                pattern = torch.tensor([float("nan"), 65504.0, -65504.0, 0.0])
                row_kind = torch.arange(pad.shape[0]) % 4
                values = torch.where((row_kind == 3).unsqueeze(-1), noise, pattern[row_kind].unsqueeze(-1))
                pad.copy_(values.to(t.dtype))
            else:
                pad.zero_()
        out[name] = t
    return out


def to_device(inputs: dict, dev: str) -> dict:
    return {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def row_bytes(t: torch.Tensor) -> torch.Tensor:
    """[rows, bytes per row] uint8 view (bitwise comparisons see NaN payloads and -0.0)."""
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8).reshape(t.shape[0], -1)


def same_rows(a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(row_bytes(a)[rows], row_bytes(b)[rows])


@dataclass
class CaseResult:
    cosines: dict = field(default_factory=dict)  # result name -> cosine on the checked rows
    deterministic: bool = True
    padding_harmless: bool = True
    rows_checked: int = 0
    rows_real: int = 0
    sampled: bool = False
    launches: list = field(default_factory=list)  # emulator LaunchRecords of the first run

    def failures(self, cosine_min: float) -> list[str]:
        out = [f"{n}: cosine {c:.6f} < {cosine_min}" for n, c in self.cosines.items() if not c >= cosine_min]
        if not self.deterministic:
            out.append("two runs gave different bytes")
        if not self.padding_harmless:
            out.append("garbage in graph-padding rows changed real rows")
        if self.rows_checked == 0:
            out.append("no real row was checked")
        return out


def _run(entry, inputs: dict, *, order_seed: int | None, sample: bool):
    dev = devices.current()
    if not dev.emulated:
        outputs = entry(**inputs)
        torch.cuda.synchronize()
        return _as_tuple(outputs), []
    from harness import emulator

    opts = dict(workgroup_order_seed=order_seed)
    if sample:
        opts.update(workgroup_sample=EMULATOR_SAMPLE_WORKGROUPS, sample_seed=0)
    with emulator.options(**opts), emulator.launches() as records:
        outputs = entry(**inputs)
    return _as_tuple(outputs), list(records)


def _as_tuple(outputs) -> tuple:
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


def _rows_owned(records, tokens: int) -> torch.Tensor:
    """Rows whose workgroups ran in every launch (workgroup x owns rows [x*r, (x+1)*r))."""
    owned = torch.ones(tokens, dtype=torch.bool)
    for rec in records:
        if rec.workgroups_executed is None:  # every workgroup ran
            continue
        grid_x = rec.grid[0]
        per_wg = -(-tokens // grid_x)
        ran = torch.zeros(tokens, dtype=torch.bool)
        for wg in rec.workgroups_executed:
            ran[wg[0] * per_wg: (wg[0] + 1) * per_wg] = True
        owned &= ran
    return owned


def check_case(package, entry, op_name: str, dims: dict, tokens: int, real: int, seed: int) -> CaseResult:
    op = OPS[op_name]
    dev = devices.current().torch_device
    sample = devices.current().emulated and package.workgroups == "rows"
    clean = op.build_inputs(tokens, dims, seed)
    entry_name = package.entry_for_op(op_name)
    garbage_in = to_device(package.entry_inputs(entry_name, fill_padding(clean, op.row_inputs, real, True)), dev)
    zero_in = to_device(package.entry_inputs(entry_name, fill_padding(clean, op.row_inputs, real, False)), dev)

    first, records = _run(entry, garbage_in, order_seed=None, sample=sample)
    second, _ = _run(entry, garbage_in, order_seed=seed_of("order", seed), sample=sample)
    zero_padded, _ = _run(entry, zero_in, order_seed=None, sample=sample)

    result = CaseResult(rows_real=real, launches=records)
    rows = torch.zeros(tokens, dtype=torch.bool)
    rows[:real] = True
    if sample:
        owned = _rows_owned(records, tokens)
        result.sampled = bool((~owned[:real]).any())
        rows &= owned
    result.rows_checked = int(rows.sum())

    result.deterministic = all(same_rows(a, b, rows) for a, b in zip(first, second))
    result.padding_harmless = all(same_rows(a, b, rows) for a, b in zip(first, zero_padded))
    real_inputs = {k: (v[:real] if k in op.row_inputs else v) for k, v in clean.items()}
    expected = op.to_float(op.reference(**real_inputs))
    got = op.to_float(tuple(t.cpu()[:real] for t in first))
    checked = rows[:real]
    for name, g, e in zip(op.result_names, got, expected):
        result.cosines[name] = cosine(g[checked], e[checked])
    return result


@contextlib.contextmanager
def no_execution():
    """Launch without executing (emulator only): for walks that check host behaviour, not numerics."""
    if devices.current().emulated:
        from harness import emulator

        with emulator.options(execute=False):
            yield
    else:
        yield
