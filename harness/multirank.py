"""The multi-rank case kind: an op whose kernel package declares `ranks = n` in its kernel.toml runs each
case on n ranks (n emulated devices in n processes, harness/emulator/ranks.py; on a GPU node, n GPUs).

The reference takes every rank's partial stacked in its input `x` [ranks, tokens, ...]; rank r calls the entry
with x[r] (the other inputs whole) after creating the package's communicator. A rank process builds only its
own partial (the op's builder takes `dims["only_rank"]`: 8192 tokens would be 8 x 47 MB per process). A case checks:
- every rank's outputs are bitwise equal to every other rank's (an all-reduce must give all ranks the same
  bits; no other all-reduce test checks this);
- rank 0's results against the reference (real rows): cosine >= the op's threshold, and the results the
  contract declares exact (`EXACT`) bitwise equal;
- a second run, with garbage in the graph-padding rows, another workgroup order and wave interleaving and
  per-rank start delays, gives the same real-row bytes on every rank (determinism, harmless padding, no
  dependence on which rank arrives first);
- nothing compiles after the entry's warm-up, on any rank;
- on the emulator both runs are sanitized (missing waits, hazards; memory accesses must stay inside the
  entry's tensors and the communicator's buffers of all ranks);
- above the package's `sample_above_tokens` (kernel.toml; an op may set its own) the emulator runs a seeded
  sample of SAMPLE_WORKGROUPS workgroups and the one holding the last real row (the package's
  `emulator_workgroup_of_row`), the same on every rank (a workgroup waits only for the peers' workgroup of
  the same index), and only the rows those produce (the package's `emulator_rows`) are compared;
- a package with tiers by token count (`TWO_STAGE_MIN_TOKENS`) gives the same bytes for every row just below
  and at the tier edge (the same inputs at edge - 1 and edge tokens): crossing the edge changes no row (the
  upper call also takes x in place, from the communicator's `input_buffer`).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from dataclasses import dataclass, field

import torch

from references import OPS, cosine

# results (by to_float position) that the contract says are bitwise equal to the reference
EXACT = {"allreduce": (0,), "allreduce_fused_add_rmsnorm": (1,), "allreduce_fused_add_rmsnorm_mxfp8": (1,)}
COUNTER_KEYS = ("global_load_bytes", "global_store_bytes", "global_load_distinct_bytes", "global_atomic_bytes",
                "wave_instructions", "workgroups")
SANITIZE = os.environ.get("AMD_KERNELS_SANITIZE", "1") != "0"
SAMPLE_WORKGROUPS = 4


@dataclass
class MultiRankResult:
    cosines: dict = field(default_factory=dict)
    exact: dict = field(default_factory=dict)  # result name -> bitwise equal to the reference
    ranks_equal: bool = True
    repeat_equal: bool = True
    rows_real: int = 0
    compiles_after_warm_up: list = field(default_factory=list)
    counters: list = field(default_factory=list)  # per rank: bytes loaded / stored by the kernel launches
    # per rank: the cost model's projected MI355X us of the first run (benchmarks/costmodel.py; emulator only)
    projected_us: list = field(default_factory=list)
    rows_checked: list | None = None  # the sampled rows (None: rows 0 .. rows_real - 1)
    tier_edge_equal: bool | None = None  # rows at edge - 1 and edge tokens equal (None: no tiers)
    seconds: float = 0.0  # the slowest rank's time for this count (build, two runs)
    tier_edge_seconds: float = 0.0

    def failures(self, cosine_min: float) -> list[str]:
        out = [f"{n}: cosine {c:.6f} < {cosine_min}" for n, c in self.cosines.items() if not c >= cosine_min]
        out += [f"{n}: not bitwise equal to the reference" for n, ok in self.exact.items() if not ok]
        if not self.ranks_equal:
            out.append("ranks returned different bytes")
        if not self.repeat_equal:
            out.append("the second run (padding garbage, other orders and arrival times) gave other bytes")
        if self.rows_real == 0:
            out.append("no real row was checked")
        if self.tier_edge_equal is False:
            out.append("the same rows gave other bytes just below and at the tier edge")
        if self.compiles_after_warm_up:
            out.append(f"compiled after warm-up: {self.compiles_after_warm_up}")
        return out


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def _pad(inputs: dict, real: int) -> dict:
    """Garbage (NaN, +-65504, large noise) in rows real.. of x (every rank's) and of the residual."""
    from harness.checks import fill_padding

    out = fill_padding(inputs, tuple(n for n in ("residual",) if n in inputs), real, garbage=True)
    out["x"] = torch.stack([fill_padding({"x": p}, ("x",), real, garbage=True)["x"] for p in inputs["x"]])
    return out


def rank_worker(rank: int, world: int, module: str, entry_name: str, op: str, dims: dict, counts: list,
                sample_above: int = 0) -> list:
    """Runs in rank process `rank`: for each (tokens, real, seed) in `counts`, two runs of the entry (a seeded
    workgroup sample above `sample_above` tokens on the emulator). Returns, per count, both runs' outputs
    (the checked rows), the first run's launch counters and the tier-edge comparison."""
    import importlib

    from amd_kernels import compile_watch
    from amd_kernels.comm import communicator

    emulated = os.environ.get("AMD_KERNELS_DEVICE") == "emulator"
    mod = importlib.import_module(module)
    entry = getattr(mod, entry_name)
    edge = getattr(mod, "TWO_STAGE_MIN_TOKENS", None)
    most = max([t for t, _, _ in counts] + ([edge] if edge else []))
    comm = communicator.create(max_tokens=most, hidden=int(dims["hidden"]))
    entry.warm_up()
    with compile_watch.recording() as events:
        out = _cases(entry, mod, comm, rank, op, dims, counts, emulated, sample_above)
        start = time.perf_counter()
        edge_equal = _tier_edge(entry, comm, rank, op, dims, edge, emulated) if edge else None
        edge_seconds = time.perf_counter() - start
    compiles = [str(e) for e in compile_watch.serving_compiles(events)]
    for o in out:
        o["compiles_after_warm_up"] = compiles
        o["tier_edge_equal"] = edge_equal
        o["tier_edge_seconds"] = edge_seconds
    return out


def _mine(inputs: dict, rank: int, emulated: bool) -> dict:
    mine = {k: (v[rank].contiguous() if k == "x" else v) for k, v in inputs.items()}
    if not emulated:
        mine = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in mine.items()}
    return mine


def _cases(entry, mod, comm, rank, op, dims, counts, emulated, sample_above) -> list:
    out = []
    for tokens, real, seed in counts:
        start = time.perf_counter()
        inputs = OPS[op].build_inputs(tokens, {**dims, "only_rank": rank}, seed)  # x [1, ...]: this rank's
        sample = SAMPLE_WORKGROUPS if emulated and sample_above and tokens > sample_above else None
        # the workgroup holding the last real row runs too: the padding next to it (or in its row group)
        also = [mod.emulator_workgroup_of_row(tokens, mod.tier(tokens), real - 1)] if sample else []
        runs, counters, rows, projected = [], [], None, None
        for attempt, case_inputs in enumerate((inputs, _pad(inputs, real) if real < tokens else inputs)):
            mine = _mine(case_inputs, 0, emulated)
            if attempt:  # other arrival times: a seeded per-rank delay before the second run
                time.sleep(random.Random(seed * 31 + rank).uniform(0.0, 0.5))
            outputs, records = _call(entry, mine, comm, emulated, order_seed=seed + attempt, sample=sample,
                                     sample_seed=seed, also=also)
            outs = tuple(o.cpu() for o in _as_tuple(outputs))
            if sample is not None:  # the rows the sampled workgroups produced (the same in both runs)
                rows = mod.emulator_rows(tokens, mod.tier(tokens), records[-1].workgroups_executed or [])
                outs = tuple(o[rows] for o in outs)
            runs.append(outs)
            counters.append([{"kernel": r.kernel_name, **{k: r.counters[k] for k in COUNTER_KEYS}}
                             for r in records])
            if attempt == 0 and records:
                projected = _project(records, mine["x"], comm.ranks, mod.tier(tokens))
        out.append({"runs": runs, "counters": counters[0], "rows": rows, "projected_us": projected,
                    "seconds": time.perf_counter() - start})
    return out


def _project(records, x, ranks: int, tier: str):
    """This rank's projected us (in the rank process, where the kernels' code objects are loaded). Link bytes:
    one-stage pulls every peer's partial, (ranks - 1) x the bytes of x; two-stage pulls 2 (ranks - 1) / ranks
    of them (the reduce-scatter, then the all-gather of the summed rows)."""
    from benchmarks import costmodel

    nbytes = x.numel() * x.element_size()
    link = (ranks - 1) * nbytes if tier == "one_stage" else 2 * (ranks - 1) * nbytes // ranks
    return costmodel.project_records(records, link_bytes=link)["us"]


def _tier_edge(entry, comm, rank, op, dims, edge, emulated) -> bool:
    """The same rows at edge - 1 tokens (the lower tier, x copied in) and at edge tokens (the upper tier, x
    already in the registered buffer: `input_buffer`): equal bytes?"""
    inputs = OPS[op].build_inputs(edge, dims, 4242)
    below = {k: (v[:, : edge - 1] if k == "x" else v[: edge - 1] if k in OPS[op].row_inputs else v)
             for k, v in inputs.items()}
    lo, _ = _call(entry, _mine(below, rank, emulated), comm, emulated, order_seed=1, sanitize=False)
    upper = _mine(inputs, rank, emulated)
    staged = comm.input_buffer(edge)  # the upper call takes its input in place (the producer-writes-there path)
    staged.copy_(upper["x"])
    hi, _ = _call(entry, {**upper, "x": staged}, comm, emulated, order_seed=2, sanitize=False)
    return all(torch.equal(_bytes(a), _bytes(b[: edge - 1])) for a, b in zip(_as_tuple(lo), _as_tuple(hi)))


def _call(entry, inputs, comm, emulated, order_seed, sample=None, sample_seed=0, sanitize=SANITIZE, also=()):
    if not emulated:
        out = entry(**inputs)
        torch.cuda.synchronize()
        return out, []
    from harness import emulator

    # the same order and sample on every rank (ranks.py): workgroup b waits for the peers' workgroup b
    opts = dict(workgroup_order_seed=order_seed, workgroup_sample=sample, sample_seed=sample_seed, workgroup_also=also)
    if sanitize:
        opts.update(sanitize=True, interleave_seed=order_seed)
    roots = [inputs, comm.inputs, comm.sums, comm.signals]
    guard = emulator.guard(roots) if sanitize else contextlib.nullcontext()
    with emulator.options(**opts), emulator.launches() as records, guard:
        out = entry(**inputs)
    return out, list(records)


def compile_for_ranks(module: str, entry_name: str) -> None:
    """Compile the entry's variants into the disk cache here, before its rank processes start (emulator only:
    this process then loads them too). Otherwise every rank, finding the cache cold, would start its own
    compile workers and compile the same variants (a cold allreduce run cost 90 CPU-s against 49 warm). Not
    a caller's warm-up: serving in this process is not armed by it (compile_watch)."""
    import importlib

    entry = getattr(importlib.import_module(module), entry_name)
    keys = list(dict.fromkeys(k for mode in entry.modes.values() for k in mode))
    entry.table.warm(keys, f"{entry_name} (for its ranks)", arm=False)


def check_cases(module: str, entry_name: str, op: str, dims: dict, counts: list, world: int = 8,
                sample_above: int = 0) -> list:
    """Run every (tokens, real, seed) of `counts` on `world` ranks (one set of rank processes for all);
    returns a MultiRankResult per count."""
    from harness import device as devices
    from harness.emulator import ranks

    if devices.current().emulated:
        compile_for_ranks(module, entry_name)
    per_rank = ranks.run(rank_worker, world=world, args=(module, entry_name, op, dims, list(counts), sample_above),
                         seed=counts[0][2])
    return [_judge(op, dims, tokens, real, seed, [pr[i] for pr in per_rank])
            for i, (tokens, real, seed) in enumerate(counts)]


def _judge(op, dims, tokens, real, seed, results) -> MultiRankResult:
    spec = OPS[op]
    res = MultiRankResult(rows_real=real)
    first = results[0]["runs"][0]
    sampled = results[0].get("rows")
    res.tier_edge_equal = results[0].get("tier_edge_equal")
    if sampled is not None:  # outputs hold only the sampled rows, in this order; keep the real ones
        keep = [i for i, r in enumerate(sampled) if r < real]
        res.rows_checked = [sampled[i] for i in keep]
        res.rows_real = len(keep)
    else:
        keep = list(range(real))
    res.seconds = max(rr.get("seconds", 0.0) for rr in results)
    res.tier_edge_seconds = max(rr.get("tier_edge_seconds", 0.0) for rr in results)
    for rr in results:
        if rr.get("rows") != sampled:
            res.ranks_equal = False
        res.tier_edge_equal = res.tier_edge_equal if rr.get("tier_edge_equal") is not False else False
        for attempt, run in enumerate(rr["runs"]):
            for a, b in zip(run, first):
                if not torch.equal(_bytes(a[keep]), _bytes(b[keep])):
                    if attempt == 0:
                        res.ranks_equal = False
                    else:
                        res.repeat_equal = False
        res.counters.append(rr["counters"])
        if rr.get("projected_us") is not None:
            res.projected_us.append(rr["projected_us"])
        res.compiles_after_warm_up += rr["compiles_after_warm_up"]
    inputs = spec.build_inputs(tokens, dims, seed)
    rows = res.rows_checked if sampled is not None else list(range(real))
    ref_inputs = {k: (v[:, rows] if k == "x" else v[rows] if k in spec.row_inputs else v)
                  for k, v in inputs.items()}
    want = spec.to_float(spec.reference(**ref_inputs))
    got = spec.to_float(tuple(t[keep] for t in first))
    for i, (name, g, w) in enumerate(zip(spec.result_names, got, want)):
        res.cosines[name] = cosine(g, w)
        if i in EXACT.get(op, ()):
            res.exact[name] = torch.equal(g, w)
    return res


def bad_input_worker(rank: int, world: int, module: str, dims: dict) -> dict:
    """Runs in each rank: the errors a multi-rank fused entry must give (messages returned, not raised).

    - communicators created with different sizes on different ranks (every rank raises);
    - a token count above the registered buffer (names x and the limit), a wrong dtype (names residual), and
      the same wrong dtype through the op's fake (what torch.compile traces with: the same message);
    - with AMD_KERNELS_CHECK_RANKS=1: ranks calling with different token counts, and one rank calling with
      another dtype (every rank raises, naming x and both ranks);
    - the last rank never calls, in each tier (2 tokens: one-stage; the edge: two-stage): the others' launch stops
      with the emulator's hang report (ranks.py).
    """
    import importlib

    from amd_kernels.comm import communicator

    entry = importlib.import_module(module).allreduce_fused_add_rmsnorm
    entry.warm_up()
    out = {}

    def catch(key, fn):
        try:
            fn()
            out[key] = None
        except Exception as e:  # noqa: BLE001 - the message is the result
            out[key] = f"{type(e).__name__}: {e}"

    catch("sizes", lambda: communicator.create(max_tokens=4 if rank else 8, hidden=int(dims["hidden"])))
    edge = importlib.import_module(module).TWO_STAGE_MIN_TOKENS
    communicator.create(max_tokens=edge, hidden=int(dims["hidden"]))
    inputs = OPS["allreduce_fused_add_rmsnorm"].build_inputs(edge + 1, dims, 0)
    mine = {**inputs, "x": inputs["x"][rank].contiguous()}
    catch("too_many_tokens", lambda: entry(**mine))
    small = {**{k: (v[:2] if isinstance(v, torch.Tensor) and v.dim() == 2 else v) for k, v in mine.items()}}
    bad_dtype = {**small, "residual": small["residual"].float()}
    catch("dtype", lambda: entry(**bad_dtype))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        catch("fake_dtype", lambda: entry(**{k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                                             for k, v in bad_dtype.items()}))
    from amd_kernels import host

    os.environ["AMD_KERNELS_CHECK_RANKS"] = "1"  # the host-side cross-rank check (a debugging mode)
    host.reload_env()  # the host code reads its switches once per process
    uneven = {**mine, "x": mine["x"][: 3 if rank == 0 else 2], "residual": mine["residual"][: 3 if rank == 0 else 2]}
    catch("uneven_tokens", lambda: entry(**uneven))
    catch("rank_dtype", lambda: entry(**{**small, "x": small["x"].float() if rank == 1 else small["x"]}))
    del os.environ["AMD_KERNELS_CHECK_RANKS"]
    host.reload_env()
    if rank != world - 1:
        from harness import emulator

        at_edge = {k: (v[:edge] if isinstance(v, torch.Tensor) and v.dim() == 2 else v) for k, v in mine.items()}
        with emulator.options(workgroup_order_seed=0):
            catch("absent_rank", lambda: entry(**small))
            catch("absent_rank_two_stage", lambda: entry(**at_edge))
    return out
