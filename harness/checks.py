"""The checks every kernel entry passes at every regime token count.

- cosine of each result against the reference >= the op's threshold (real rows only);
- bitwise determinism: a second run gives the same bytes (under the emulator, with another workgroup order);
- padding rows harmless: garbage in the graph-padding rows leaves the real rows' bytes unchanged (the second
  run has zero padding where the first had garbage, so equal bytes show both; a third run, only when they
  differ, tells which failed);
- no compile after warm-up (compile_watch records every FlyDSL trace);
- batch invariance (check_batch_invariance): a row's bits alone equal its bits first or last in batches on
  both sides of every tier edge, on realistic inputs and on the op's build_cancelling inputs;
- special values (check_special_values): on the op's build_special inputs, NaN and +-Inf exactly where the
  reference has them, the rest within the cosine threshold row by row.
- sequence invariance (ops with `Op.sub_batch`, a batch of sequences): a few sequences give the same output bits
  alone as inside the padded batch (check_sequence_invariance).
An op whose reference writes arguments in place (`Op.mutates`, e.g. a KV cache) also has them compared: the
elements the reference wrote reach the op's cosine, every other byte keeps its value, and the runs
leave the same bytes; such ops run unsampled on the emulator.
One path checks every case (`Case.check`): build the seeded inputs, run the entry twice (three times to tell two
failures apart), ask the case's sampling kind which output elements to check (`Case.checked`), compare. On the
emulator, large launches of kernels whose workgroups each own a block of rows (kernel.toml `workgroups = "rows"`)
or write output tiles independently (`workgroups = "tiles"`) execute a seeded sample of workgroups; then only the
rows those workgroups own ("rows") or exactly the output bytes they stored ("tiles", from each LaunchRecord's
stored intervals) are checked, and the result says so. Multi-launch pipelines whose workgroups follow data
(`workgroups = "tokens"`, e.g. MoE tiles of sorted tokens) run a seeded sample of token rows: the package's
`emulator_workgroups(tokens, kernel, grid, pointers, read)` names each launch's workgroups those rows need, and the
output bytes stored are checked as for "tiles". The kinds are data (SAMPLINGS): the grid axis holding token blocks,
or the package hook, and what a sampled run checks.

On the emulator every run is also sanitized (harness/emulator/sanitizer.py): missing s_waitcnt, MFMA results
read too early, LDS races between waves, accesses outside the tensors the entry receives or creates, and
reads of never-written bytes of fresh tensors raise SanitizerReport and fail the case. The determinism run
uses another workgroup order and another seeded wave interleaving.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import random
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from harness import device as devices
from harness import memory
from references import OPS, cosine

# On the emulator, launches with more workgroups than this run a sample of this many.
EMULATOR_SAMPLE_WORKGROUPS = 16
# `workgroups = "tokens"`: the token rows a sampled run computes, where the package's kernel.toml gives no
# `sample_tokens` (each MoE token costs its top-k tiles; each attention row its sequence's workgroups).
EMULATOR_SAMPLE_TOKENS = 3


def sample_tokens(package) -> int:
    """The token rows a sampled run of `package` computes."""
    return package.sample_tokens or EMULATOR_SAMPLE_TOKENS
# Sanitizer detectors the harness runs with (AMD_KERNELS_SANITIZE=0 turns them off, for timing only).
SANITIZE = os.environ.get("AMD_KERNELS_SANITIZE", "1") != "0"


def seed_of(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def fill_padding(inputs: dict, row_inputs: tuple, real: int, garbage: bool, padding_values: tuple = ()) -> dict:
    """Rows real.. of the token-row inputs: garbage (NaN, +-65504, 1e4-scale noise) or zeros; an input named
    in `padding_values` ((name, value) pairs, e.g. slot_mapping -1) gets that value in both cases."""
    out = dict(inputs)
    fixed = dict(padding_values)
    for name in row_inputs:
        t = inputs[name].clone()
        pad = t[real:]
        if pad.numel():
            if name in fixed:
                pad.fill_(fixed[name])
            elif garbage:
                noise = torch.randn(pad.shape, generator=torch.Generator().manual_seed(real)) * 1e4
                pattern = torch.tensor([float("nan"), 65504.0, -65504.0, 0.0])
                row_kind = (torch.arange(pad.shape[0]) % 4).view(-1, *([1] * (pad.dim() - 1)))  # any rank
                values = torch.where(row_kind == 3, noise, pattern[row_kind])
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
    cosines: dict = field(default_factory=dict)  # result name -> cosine on the checked elements
    deterministic: bool = True
    padding_harmless: bool = True
    rows_checked: int = 0
    rows_real: int = 0
    sampled: bool = False
    elements_checked: dict = field(default_factory=dict)  # result name -> elements compared
    mutation_problems: list = field(default_factory=list)  # mutated arguments: bytes written where they must not be
    launches: list = field(default_factory=list)  # emulator LaunchRecords of the first run
    masks: list = field(default_factory=list)  # per output of the first run: the elements checked (real rows)

    def failures(self, cosine_min: float) -> list[str]:
        out = [f"{n}: cosine {c:.6f} < {cosine_min}" for n, c in self.cosines.items() if not c >= cosine_min]
        if not self.deterministic:
            out.append("two runs gave different bytes")
        if not self.padding_harmless:
            out.append("garbage in graph-padding rows changed real rows")
        if self.rows_checked == 0:
            out.append("no real row was checked")
        out += self.mutation_problems
        return out


def _run(entry, inputs: dict, *, order_seed: int | None, sample: dict):
    """`sample`: emulator sampling options (empty: every workgroup runs)."""
    dev = devices.current()
    if not dev.emulated:
        outputs = entry(**inputs)
        torch.cuda.synchronize()
        return _as_tuple(outputs), []
    from harness import emulator

    opts = dict(workgroup_order_seed=order_seed, **sample)
    if SANITIZE:
        opts.update(sanitize=True, interleave_seed=order_seed or 0)
    guard = emulator.guard(inputs) if SANITIZE else contextlib.nullcontext()
    with emulator.options(**opts), emulator.launches() as records, guard:
        outputs = entry(**inputs)
    memory.trim()  # the run's freed heap pages, before the next run or the reference allocates
    return _as_tuple(outputs), list(records)


def _as_tuple(outputs) -> tuple:
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


# ---- sampling: the part of a large launch the emulator runs, and what is then checked ---------------------
@dataclass(frozen=True)
class Sampling:
    """A kernel.toml `workgroups` kind. token_axis: the grid axis indexing blocks of token rows (None: the
    package's TOKENS_HOOK names the workgroups some token rows need); checks_stored: a sampled run checks
    exactly the output bytes its workgroups stored (else the rows its workgroups own)."""

    token_axis: int | None
    checks_stored: bool


SAMPLINGS = {
    "rows": Sampling(token_axis=0, checks_stored=False),  # workgroup x owns a contiguous block of token rows
    "tiles": Sampling(token_axis=1, checks_stored=True),  # independent output tiles, grid y the token tile
    "tokens": Sampling(token_axis=None, checks_stored=True),  # workgroups follow data (MoE tiles, sequences)
}
SAMPLED_KINDS = tuple(SAMPLINGS)
# The package function of a "tokens" kind: emulator_workgroups(tokens, kernel, grid, pointers, read) -> the
# workgroups of one launch the token rows `tokens` need (None: all of them).
TOKENS_HOOK = "emulator_workgroups"


def tokens_hook(package):
    return getattr(importlib.import_module(package.module), TOKENS_HOOK)


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


def stored_mask(records, t: torch.Tensor) -> torch.Tensor:
    """Bool mask (t.shape) of the elements of contiguous `t` whose every byte some launch stored.

    The stored byte intervals inside `t` are merged (sorted by start, a running maximum of the ends), so the
    merged ones are disjoint with gaps between them: an element is covered iff one merged interval holds all
    its bytes. Those elements are marked with a 0/1 difference array over the elements (work in the element
    count and the interval count, not in bytes)."""
    size = t.element_size()
    nbytes = t.numel() * size
    lo = t.data_ptr()
    parts = [rec.stored for rec in records if rec.stored is not None and len(rec.stored)]
    iv = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
    iv = np.clip(iv[(iv[:, 1] > lo) & (iv[:, 0] < lo + nbytes)] - lo, 0, nbytes)
    el = np.zeros(t.numel() + 1, np.int8)
    if len(iv):
        iv = iv[np.argsort(iv[:, 0], kind="stable")]
        ends = np.maximum.accumulate(iv[:, 1])
        first = np.ones(len(iv), bool)
        first[1:] = iv[1:, 0] > ends[:-1]           # a gap before it: a new merged interval starts
        last = np.append(first[1:], True)
        e0 = -(-iv[first, 0] // size)               # the first element wholly inside
        e1 = ends[last] // size                     # one past the last
        keep = e1 > e0
        np.add.at(el, e0[keep], 1)                  # disjoint ranges: the running sum stays 0 or 1
        np.add.at(el, e1[keep], -1)
    mask = np.cumsum(el[:-1], dtype=np.int8) > 0
    return torch.from_numpy(mask).reshape(t.shape)


def _stored_masks(records, outputs) -> list:
    return [stored_mask(records, t.detach().cpu().contiguous()) if t.is_contiguous() else
            torch.zeros(t.shape, dtype=torch.bool) for t in outputs]


def _same_masked(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ab = a.detach().cpu().contiguous().view(torch.uint8).reshape(*a.shape, -1) if a.dim() else a
    bb = b.detach().cpu().contiguous().view(torch.uint8).reshape(*b.shape, -1) if b.dim() else b
    return torch.equal(ab[mask], bb[mask])


def _fresh(inputs: dict, mutates: tuple) -> dict:
    return {k: (v.clone() if k in mutates else v) for k, v in inputs.items()}


def _element_bytes(t: torch.Tensor) -> torch.Tensor:
    """[*t.shape, element size] uint8 view (NaN payloads compare bitwise)."""
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8).reshape(*t.shape, t.element_size())


def _check_mutated(op, clean: dict, expected: dict, first: dict, result: CaseResult) -> None:
    """The op's mutated arguments after the entry's first run (`first`) against the reference's (expected).

    Elements the reference changed ("written") must reach the op's cosine; every other byte must keep its
    value before the call (the builder fills unused parts with garbage, so a stray write shows). Whether the
    runs left the same bytes is Case.check's comparison of the runs."""
    for name in op.mutates:
        before, want, got = _element_bytes(clean[name]), _element_bytes(expected[name]), _element_bytes(first[name])
        written = (want != before).any(-1)
        kept = ~written
        if not torch.equal(got[kept], before[kept]):
            stray = int((got != before).any(-1)[kept].sum())
            result.mutation_problems.append(f"{name}: {stray} elements outside the reference's writes changed")
        g, e = first[name].detach().cpu().float(), expected[name].detach().cpu().float()
        result.cosines[f"{name} written"] = cosine(g[written], e[written])
        result.elements_checked[f"{name} written"] = int(written.sum())


def _reference_call(op, clean: dict, real: int, rows: torch.Tensor | None = None) -> tuple:
    """The reference on the real rows (rows: only those, an op with `rows_independent`); its mutated arguments
    are copies: returns (outputs, {name: state})."""
    def real_rows(v: torch.Tensor) -> torch.Tensor:
        return v[:real] if rows is None else v[:real].index_select(0, rows)

    real_inputs = {k: (real_rows(v) if k in op.row_inputs else v) for k, v in clean.items()}
    real_inputs.update({m: clean[m].clone() for m in op.mutates})
    return op.reference(**real_inputs), {m: real_inputs[m] for m in op.mutates}


def built_inputs(op, tokens: int, real: int, dims: dict, seed: int) -> dict:
    """The op's seeded inputs at `tokens` rows, rows real.. made graph padding in its other inputs too
    (`Op.pad_inputs`, e.g. attention's sequence metadata); the row inputs' padding is filled later."""
    clean = op.build_inputs(tokens, dims, seed)
    return op.pad_inputs(clean, real) if op.pad_inputs is not None and real < tokens else clean


@dataclass
class Run:
    """One call of the entry: its outputs, the emulator's launch records, its mutated arguments' state."""

    outputs: tuple
    records: list
    state: dict


@dataclass
class Case:
    """One numerics case: an op's entry at `tokens` rows, rows real.. graph padding, seeded inputs."""

    package: object  # discovery.KernelPackage
    entry: object
    op_name: str
    dims: dict
    tokens: int
    real: int
    seed: int

    @property
    def op(self):
        return OPS[self.op_name]

    @functools.cached_property
    def sampling(self) -> Sampling | None:
        """How the emulator samples this case; None: every workgroup runs (a GPU, a package without a
        sampling kind, counts up to its sample_above(op), and ops that mutate arguments, whose check
        needs every write)."""
        if not devices.current().emulated or self.op.mutates or self.tokens <= self.package.sample_above(self.op_name):
            return None
        return SAMPLINGS.get(self.package.workgroups)

    def emulator_options(self) -> dict:
        """The emulator options of a sampled run ({}: whole): a seeded sample of workgroups, or for a
        "tokens" kind the workgroups a seeded sample of token rows needs."""
        if self.sampling is None:
            return {}
        if self.sampling.token_axis is not None:
            return dict(workgroup_sample=EMULATOR_SAMPLE_WORKGROUPS, sample_seed=0)
        draw = random.Random(seed_of("tokens", self.seed))
        rows = draw.sample(range(self.real), min(self.real, sample_tokens(self.package)))
        return dict(workgroup_filter=functools.partial(tokens_hook(self.package), frozenset(sorted(rows))))

    def runs(self):
        """The runs, each yielded as it finishes: (1) garbage padding; (2) another workgroup order / wave
        interleaving, with zero padding where the case has padding rows; (3) only when check() asks, after (2)
        differed from (1): garbage padding in (2)'s order, which tells an order dependence from a padding
        leak. Each run mutates its own copy of the op's mutated arguments (all start from the same bytes).
        Only one set of padded inputs exists at a time; a case without padding rows runs on the clean inputs
        themselves (the entry writes only the arguments in `mutates`)."""
        op, dev = self.op, devices.current().torch_device
        entry_name = self.package.entry_for_op(self.op_name)

        def inputs(garbage: bool) -> dict:
            padded = self.clean
            if self.padded:
                padded = fill_padding(self.clean, op.row_inputs, self.real, garbage, op.padding_values)
            return to_device(self.package.entry_inputs(entry_name, padded), dev)

        sample, other_order = self.emulator_options(), seed_of("order", self.seed)
        given, garbage_given = inputs(True), True
        for order_seed, garbage in ((None, True), (other_order, not self.padded), (other_order, True)):
            if garbage != garbage_given:
                del given
                given, garbage_given = inputs(garbage), garbage
            fresh = _fresh(given, op.mutates)
            outputs, records = _run(self.entry, fresh, order_seed=order_seed, sample=sample)
            yield Run(outputs, records, {m: fresh[m] for m in op.mutates})
            del outputs, records, fresh

    @property
    def padded(self) -> bool:
        return self.real < self.tokens

    @functools.cached_property
    def clean(self) -> dict:
        """The seeded inputs (built once; check() drops them when the reference no longer needs them)."""
        return built_inputs(self.op, self.tokens, self.real, self.dims, self.seed)

    def checked(self, run: Run) -> tuple[list, bool]:
        """Per output, the elements a run's result is checked on (its real rows; of a sampled run only those
        its workgroups computed), and whether the sample left some real row out (a sampled case)."""
        real_rows = torch.arange(self.tokens) < self.real
        if self.sampling is not None and self.sampling.checks_stored:
            masks = _stored_masks(run.records, run.outputs)
            for m in masks:
                m[self.real:] = False
            return masks, any(rec.sampled for rec in run.records)
        rows = real_rows
        if self.sampling is not None:
            rows = rows & _rows_owned(run.records, self.tokens)
        masks = [rows.reshape(-1, *([1] * (t.dim() - 1))).expand(t.shape) for t in run.outputs]
        return masks, bool((real_rows & ~rows).any())

    def check(self) -> CaseResult:
        """Run, compare the runs as they finish (only the first run's outputs are kept), then the reference
        (on the compared rows only, for a sampled `rows_independent` op; on the sampled rows' sequences alone,
        for a sampled op with `sub_batch`) and the cosines, freeing each
        intermediate once used: the same comparisons on the same bytes, with less held at once."""
        op, real = self.op, self.real
        runs = self.runs()
        first = next(runs)
        masks, sampled = self.checked(first)
        result = CaseResult(rows_real=real, launches=first.records, sampled=sampled, masks=masks)

        # two runs agree: the same elements checked, the same bytes in them, the same mutated arguments
        def same(a: Run, a_masks: list, b: Run, b_masks: list) -> bool:
            return (all(torch.equal(x[:real], y[:real]) for x, y in zip(a_masks, b_masks))
                    and all(_same_masked(x, y, m) for x, y, m in zip(a.outputs, b.outputs, masks))
                    and all(torch.equal(_element_bytes(a.state[n]), _element_bytes(b.state[n])) for n in op.mutates))

        second = next(runs)  # another order (and zero padding): equal bytes show both properties at once
        second_masks = self.checked(second)[0]
        if not same(first, masks, second, second_masks):
            if self.padded:  # which one failed: the third run differs from the first only by its order
                third = next(runs)
                third_masks = self.checked(third)[0]
                result.deterministic = same(first, masks, third, third_masks)
                result.padding_harmless = same(third, third_masks, second, second_masks)
                del third
            else:
                result.deterministic = False
        first_state = first.state
        del second, runs

        real_masks = [m[:real] for m in masks]
        rows = None  # the real rows computed and compared (None: all)
        sub = None   # a sequence batch's sampled sequences alone, whose reference gives exactly `rows`
        if (op.rows_independent or op.sub_batch is not None) and self.sampling is not None and not op.mutates:
            wanted = torch.zeros(real, dtype=torch.bool)
            for m in real_masks:
                if m.numel():
                    wanted |= m.reshape(real, -1).any(dim=1)
            if wanted.any():  # (no row: the reference runs on all, and the case fails as before)
                rows = wanted.nonzero().flatten()
                if not op.rows_independent:  # every row of the sampled rows' sequences
                    sub, full_rows = op.sub_batch(self.clean, rows.tolist())
                    rows = torch.tensor(full_rows, dtype=torch.long)
                real_masks = [m.index_select(0, rows) for m in real_masks]
        n_rows = real if rows is None else len(rows)
        clean = self.clean
        del self.clean  # the cached inputs: the reference's mutated arguments are its own copies
        if sub is not None:
            outputs, expected_state = op.reference(**sub), {}
            del sub
        else:
            outputs, expected_state = _reference_call(op, clean, real, rows)
        if not op.mutates:
            del clean
        expected = list(op.to_float(outputs))
        del outputs
        got = list(op.to_float(tuple(t.cpu()[:real] if rows is None else t.cpu()[:real].index_select(0, rows)
                                     for t in first.outputs)))
        del first
        # rows every output is checked on completely: the mask of a result that is not one raw output
        full_rows = torch.ones(n_rows, dtype=torch.bool)
        for m in real_masks:
            full_rows &= m.reshape(n_rows, -1).all(dim=1) if m.numel() else full_rows
        rows_any = torch.zeros(n_rows, dtype=torch.bool)
        for i, name in enumerate(op.result_names[:min(len(got), len(expected))]):
            g, e = got[i], expected[i]
            got[i] = expected[i] = None  # each result's fp32 copies go once compared
            m = real_masks[i] if i < len(real_masks) and real_masks[i].shape == g.shape else None
            if m is None:
                m = full_rows.reshape(-1, *([1] * (g.dim() - 1))).expand(g.shape)
            # every element checked: the tensors themselves (g[m] would copy the same values in the same order)
            result.cosines[name] = cosine(g, e) if bool(m.all()) else cosine(g[m], e[m])
            result.elements_checked[name] = int(m.sum())
            rows_any |= m.reshape(n_rows, -1).any(dim=1)
            del g, e
        result.rows_checked = int(rows_any.sum())
        if op.mutates:
            _check_mutated(op, clean, expected_state, first_state, result)
        return result


def check_case(package, entry, op_name: str, dims: dict, tokens: int, real: int, seed: int) -> CaseResult:
    return Case(package, entry, op_name, dims, tokens, real, seed).check()


@contextlib.contextmanager
def no_execution():
    """Launch without executing (emulator only): for walks that check host behaviour, not numerics."""
    if devices.current().emulated:
        from harness import emulator

        with emulator.options(execute=False):
            yield
    else:
        yield


# ---- batch invariance --------------------------------------------------------------------------------------
# A row's output bits must not depend on the rest of the batch: the same row alone (M = 1), among other rows,
# at the start or at the end of the batch, at every token count that crosses a tier boundary. The counts
# straddle every tier edge the packages use (16/17, 24/25, 32/33, 48/49, 64/65, 72/73, 128/129, 256/257,
# 512/513) and reach the largest prefill.
INVARIANCE_COUNTS = (1, 2, 3, 5, 6, 16, 17, 24, 25, 32, 33, 48, 49, 64, 65, 72, 73, 128, 129, 256, 257, 512, 513,
                     1024, 2048, 8192)
# "tokens" packages (the MoE: seconds per emulated call) take the counts around their tier edges, small_m |
# full (2|3 at h6144, 5|6 at TP8), the moe entry's full | prefill (31|32 at TP1 and TP8, 127|128 at h6144)
# and the routed entry's full | first prefill tier (127|128 at TP1, where it is prefill128; 511|512 at TP8;
# h6144 has no routed entry), both entries' prefill | prefill128 (127|128 at TP1 (the moe entry's), 2047|2048
# at h6144, 4095|4096 at TP8), and a few beyond; on the emulator each package's
# kernel.toml narrows them to its own edges (CI time). harness/test_moe_contract.py checks that the counts
# straddle every edge.
INVARIANCE_TOKENS_COUNTS = (1, 2, 3, 5, 6, 17, 31, 32, 64, 127, 128, 256, 511, 512, 2047, 2048, 4095, 4096)
INVARIANCE_PROBES = 2  # probe rows, placed at the start and again at the end of each batch
INVARIANCE_FILLER = 29  # other rows (cycled to fill the batch)


def invariance_counts(package, max_tokens: int, op: str = "") -> list[int]:
    counts = INVARIANCE_TOKENS_COUNTS if package.workgroups == "tokens" else INVARIANCE_COUNTS
    if devices.current().emulated and op in package.emulator_op_invariance_counts:
        counts = package.emulator_op_invariance_counts[op]  # kernel.toml [emulator.op_invariance_counts]
    return [m for m in counts if m <= max_tokens]


def _token_workgroups(package, positions: frozenset, tokens: int):
    """Emulator workgroup filter: only the workgroups computing the token rows `positions` run (the kind's
    token axis splits the rows into blocks, or the package names them). None where every workgroup must run."""
    sampling = SAMPLINGS.get(package.workgroups)
    if sampling is None:
        return None
    if sampling.token_axis is None:
        return functools.partial(tokens_hook(package), positions)
    axis = sampling.token_axis

    def chooser(kernel, grid, pointers, read):
        g = grid[axis]  # token blocks of some size t with ceil(tokens / t) = g: row p lies in a block of
        # index p // t, between p * (g - 1) // tokens and p * g // tokens
        wanted = {b for p in positions for b in range(p * (g - 1) // tokens, p * g // tokens + 1)}
        return {i for i in np.ndindex(*grid) if i[axis] in wanted}

    return chooser


def _batch(base: dict, row_inputs: tuple, tokens: int, probes: int, probe: int | None = None) -> tuple[dict, list]:
    """Inputs of `tokens` rows built from `base` (rows [0, probes) the probes, the rest filler): the probe
    rows first and, when they fit, again last; the filler rows cycled between. probe=i: one row, probe i.
    Returns (inputs, [(row position, probe index)])."""
    n_base = next(iter(base[n] for n in row_inputs)).shape[0]
    if probe is not None:
        order, where = [probe], [(0, probe)]
    else:
        filler = list(range(probes, n_base))
        order = list(range(min(probes, tokens)))
        tail = list(range(probes)) if tokens >= 2 * probes else []
        middle = tokens - len(order) - len(tail)
        order += [filler[i % len(filler)] for i in range(middle)] + tail
        where = [(i, i) for i in range(min(probes, tokens))] + [(tokens - probes + i, i) for i in range(len(tail))]
    idx = torch.tensor(order, dtype=torch.long)
    return {k: (v.index_select(0, idx).contiguous() if k in row_inputs else v) for k, v in base.items()}, where


def _all_stored(records, lo: int, hi: int) -> bool:
    """Did the launches store every byte of [lo, hi)?"""
    iv = [tuple(map(int, r)) for rec in records if rec.stored is not None for r in rec.stored
          if r[1] > lo and r[0] < hi]
    pos = lo
    for a, b in sorted(iv):
        if a > pos:
            return False
        pos = max(pos, b)
    return pos >= hi


def check_batch_invariance(package, entry, op_name: str, dims: dict, counts: list, seed: int,
                           cancelling: bool) -> list[str]:
    """Failures (empty: invariant): each probe row's output bytes at every count in `counts` against the same
    row alone. cancelling: inputs from the op's build_cancelling (summation order exposed), else realistic."""
    op = OPS[op_name]
    builder = op.build_cancelling if cancelling else op.build_inputs
    if builder is None:
        return []
    dev = devices.current()
    entry_name = package.entry_for_op(op_name)
    base = package.entry_inputs(entry_name, builder(INVARIANCE_PROBES + INVARIANCE_FILLER, dims, seed))
    missing = [n for n in op.row_inputs if n not in base]
    if missing:
        raise LookupError(f"{package.path}: prepared inputs lack the row inputs {missing}")

    def run(inputs: dict, where: list):
        tokens = next(iter(inputs[n] for n in op.row_inputs)).shape[0]
        inputs = to_device(inputs, dev.torch_device)
        if not dev.emulated:
            outputs = _as_tuple(entry(**inputs))
            torch.cuda.synchronize()
            return [tuple(row_bytes(t)[p] for t in outputs) for p, _ in where], None
        from harness import emulator

        chooser = _token_workgroups(package, frozenset(p for p, _ in where), tokens)
        with emulator.options(workgroup_filter=chooser), emulator.launches() as records:
            outputs = _as_tuple(entry(**inputs))
        rows = []
        for p, _ in where:
            for t in outputs:
                size = row_bytes(t).shape[1]
                if not _all_stored(records, t.data_ptr() + p * size, t.data_ptr() + (p + 1) * size):
                    return None, f"row {p} of an output was not computed by the workgroups run"
            rows.append(tuple(row_bytes(t)[p] for t in outputs))
        return rows, None

    alone = []
    for i in range(INVARIANCE_PROBES):
        got, err = run(*_batch(base, op.row_inputs, 1, INVARIANCE_PROBES, probe=i))
        if err:
            return [f"alone, probe {i}: {err}"]
        alone.append(got[0])
    failures = []
    for m in counts:
        inputs, where = _batch(base, op.row_inputs, m, INVARIANCE_PROBES)
        got, err = run(inputs, where)
        if err:
            failures.append(f"M={m}: {err}")
            continue
        for (pos, probe), row in zip(where, got):
            for j, (a, b) in enumerate(zip(alone[probe], row)):
                if not torch.equal(a, b):
                    failures.append(f"M={m}: probe {probe} at row {pos}, output {j}: "
                                    f"{int((a != b).sum())} of {a.numel()} bytes differ from the row alone")
    return failures


# ---- special values ---------------------------------------------------------------------------------------
def check_special_values(package, entry, op_name: str, dims: dict, seed: int) -> list[str]:
    """Failures (empty: as the contract says): on the op's build_special inputs (NaN, +-Inf, subnormal rows),
    each compared result has NaN exactly where the reference has NaN, +-Inf exactly where it has +-Inf, and,
    row by row, the other elements' cosine against the reference >= the op's threshold (all zero on both
    sides counts as equal)."""
    op = OPS[op_name]
    if op.build_special is None:
        return []
    clean = op.build_special(0, dims, seed)
    inputs = to_device(package.entry_inputs(package.entry_for_op(op_name), clean), devices.current().torch_device)
    outputs, _ = _run(entry, inputs, order_seed=None, sample={})
    got = op.to_float(tuple(t.cpu() for t in outputs))
    expected = op.to_float(op.reference(**clean))
    failures = []
    for name, g, e in zip(op.result_names, got, expected):
        for what, mask in (("NaN", torch.isnan), ("+Inf", lambda t: t == float("inf")),
                           ("-Inf", lambda t: t == float("-inf"))):
            differ = (mask(g) != mask(e)).reshape(g.shape[0], -1).any(dim=1)
            failures += [f"{name} row {int(r)}: {what} where the reference has none, or the reverse"
                         for r in differ.nonzero().flatten()]
        finite = torch.isfinite(g) & torch.isfinite(e)
        for r in range(g.shape[0]):
            c = cosine(g[r][finite[r]], e[r][finite[r]])
            if not c >= op.cosine_min:
                failures.append(f"{name} row {r}: cosine {c:.6f} of the finite elements < {op.cosine_min}")
    return failures


def check_sequence_invariance(package, entry, op_name: str, dims: dict, tokens: int, real: int, seed: int) -> dict:
    """Ops with `Op.sub_batch` (a batch of sequences): the sequences owning a few seeded real rows give the
    same output bytes alone as inside the full batch (graph padding in garbage). On the emulator, a package
    sampled by "tokens" runs only those rows' workgroups in both runs, and the bytes both runs stored are
    compared. -> {"rows": rows compared, "elements": elements compared, "same": bool}."""
    op = OPS[op_name]
    dev = devices.current().torch_device
    entry_name = package.entry_for_op(op_name)
    clean = built_inputs(op, tokens, real, dims, seed)
    picked = sorted(random.Random(seed_of("invariance", seed)).sample(range(real), min(real, sample_tokens(package))))
    sub, rows = op.sub_batch(clean, picked)
    sampled = devices.current().emulated and package.workgroups == "tokens"

    def run(inputs, wanted):
        sample = {}
        if sampled:
            sample = dict(workgroup_filter=functools.partial(tokens_hook(package), frozenset(wanted)))
        return _run(entry, to_device(package.entry_inputs(entry_name, inputs), dev), order_seed=None, sample=sample)

    (full, *_), full_rec = run(fill_padding(clean, op.row_inputs, real, True, op.padding_values), rows)
    (alone, *_), alone_rec = run(sub, range(len(rows)))
    idx = torch.tensor(rows, dtype=torch.long)
    a = full.detach().cpu()[idx]
    b = alone.detach().cpu()[: len(rows)]
    mask = torch.ones(a.shape, dtype=torch.bool)
    if sampled:
        mask = stored_mask(full_rec, full.detach().cpu().contiguous())[idx] & \
            stored_mask(alone_rec, alone.detach().cpu().contiguous())[: len(rows)]
    return {"rows": len(rows), "elements": int(mask.sum()), "same": _same_masked(a, b, mask)}
