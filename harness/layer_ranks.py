"""The TP8 decoder layer on 8 ranks (8 emulated devices in 8 processes, harness/emulator/ranks.py; on a GPU
node, 8 GPUs): each rank runs the [[layer]] tp = 8 chain of regimes/gpt_oss_120b.toml on its shard.

`save_shard` writes each rank's shard (references/layer.py shard_layer_weights, its KV heads' cache, its inputs)
to a directory and `run(config, directory)` starts the ranks; rank r (`worker`) maps only its own, warms the
chain's entries up, then per layer and decode step runs two kernel chains: the first with each step's
reference on the chain's own inputs beside it ("local", as harness/chain.py; the all-reduce steps' own-input
references need every rank's partial, the caller computes them from the returned inputs), the second with
another workgroup order, its own cache copy and the emulator's sanitizer on (memory checked against the
rank's tensors and the communicator's buffers of all ranks; hazards), and a FlyDSL compile watch over both.
Each rank returns its real rows of every step output, its local references, the bytes its cache slots got,
whether its two chains gave the same bytes (caches included) and its per-step seconds.

Sampling composes as in harness/chain.py: every step runs whole, except the "tokens" packages (attention, MoE)
which run the workgroups of the real rows.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from harness import chain
from harness.toolchain import REPO

REGIME = REPO / "regimes" / "gpt_oss_120b.toml"
WORLD = 8


def save_shard(shard_dir: str, rank: int, shard: dict) -> None:
    """Rank `rank`'s shard for `run`: {"weights", "key_cache", "value_cache", "inputs": {layer_idx: [(hidden,
    residual) per step]}}, saved so the rank maps it from disk (the ranks' weights stay out of anonymous memory)."""
    torch.save(shard, os.path.join(shard_dir, f"rank{rank}.pt"))


def save_shards(shard_dir: str, weights: dict, run_: dict, inputs: dict, layers: list) -> None:
    """Every rank's save_shard from the TP1 layer `weights` (their lazy experts drawn once for the 8 shards),
    the run's whole caches (references.layer.build_*_run) and `inputs` {layer_idx: [(ranks' hidden parts,
    TP1 hidden, residual) per step]}. The caller then drops its own `weights` and calls
    references.layer.release_weights() before `run`, so the ranks start with the layer's weights freed."""
    from references import layer as ref_layer

    drawn = ref_layer.drawn_experts(weights)
    for r in range(WORLD):
        save_shard(shard_dir, r, {
            "weights": ref_layer.shard_layer_weights(drawn, r),
            "key_cache": ref_layer.shard_cache(run_["key_cache"], r),
            "value_cache": ref_layer.shard_cache(run_["value_cache"], r),
            "inputs": {li: [(p[r], res) for p, _, res in inputs[li]] for li in layers}})


def run(config: dict, shard_dir: str, timeout: float = 1800.0) -> list:
    """config: {"layers": [layer_idx, ...], "real": int, "batches": [step metadata], "seed": int}, or for steps
    of different sizes (chunked prefill) "reals": real rows per step in place of "real", and "rows": per step
    the sampled rows the "tokens" steps run (harness/chain.py; the chains' outputs are compared on those);
    shard_dir holds every rank's save_shard -> per rank, worker's result."""
    from harness import device as devices
    from harness import multirank
    from harness.emulator import ranks

    if devices.current().emulated:  # the layer's variants in the disk cache before 8 ranks look for them
        layer = chain.load_layer(REGIME, WORLD)
        for st in dict.fromkeys((st.kernel, st.entry) for st in (*layer.first_steps, *layer.steps)):
            multirank.compile_for_ranks(chain._entry(*st)[0].module, st[1])
    return ranks.run(worker, world=WORLD, args=(shard_dir, config), timeout=timeout, seed=config["seed"])


def worker(rank: int, world: int, shard_dir: str, config: dict) -> dict:
    from amd_kernels import compile_watch
    from amd_kernels.comm import communicator
    from references import layer as ref_layer

    shard = _to_device(torch.load(os.path.join(shard_dir, f"rank{rank}.pt"), weights_only=False, mmap=True))
    config = _to_device(config)
    layer = chain.load_layer(REGIME, world)
    batches = config["batches"]
    reals = config.get("reals") or [config["real"]] * len(batches)
    sampled = config.get("rows") or [None] * len(batches)
    tokens = max(b["positions"].shape[0] for b in batches)
    comm = communicator.create(max_tokens=tokens, hidden=ref_layer.HIDDEN)
    warm = {}
    for st in (*layer.first_steps, *layer.steps):
        start = time.perf_counter()
        chain._entry(st.kernel, st.entry)[1].warm_up()
        warm.setdefault(f"{st.kernel}:{st.entry}", time.perf_counter() - start)
    weights, prepared = shard["weights"], chain.Prepared()
    # own-input references: the routed MoE on the rank's slice; none for the all-reduces (every rank's x needed)
    local_refs = [{"moe": ref_layer.routed_rank_reference(rank),
                   **{st.name: None for st in steps if chain._entry(st.kernel, st.entry)[0].ranks > 1}}
                  for steps in (layer.first_steps, layer.steps)]
    out = {"warm_up": warm, "layers": {}}
    for layer_idx in config["layers"]:
        caches = [{"key": shard["key_cache"].clone(), "value": shard["value_cache"].clone()} for _ in range(2)]
        steps_out = []
        for s, batch in enumerate(batches):
            real, rows_s = reals[s], sampled[s]
            pick = list(range(real)) if rows_s is None else rows_s
            hidden, residual = shard["inputs"][layer_idx][s]
            envs, seconds = [], {}
            with compile_watch.recording() as events:
                for c in range(2):
                    roots = [weights, prepared._cache, caches[c], batch, hidden, residual, comm.inputs, comm.signals]
                    with _emulator_checks(c, config["seed"] + 97 * s, roots):
                        envs.append(chain.run_layer(
                            layer, backend="kernels", hidden=chain.padded(hidden, real),
                            residual=None if residual is None else chain.padded(residual, real), weights=weights,
                            batch=batch, cache=caches[c], layer_idx=layer_idx, real=real,
                            order_seed=None if c == 0 else config["seed"] + s, prepared=prepared, local=c == 0,
                            references=local_refs[residual is not None], rank={"tp_rank": rank}, rows=rows_s,
                            around_step=(lambda st, sec=seconds: _timed(sec, st)) if c == 0 else None))
                # the next layer's all-reduce + add + RMSNorm to MXFP8 on this layer's outputs (both chains)
                nexts = [chain.run_layer(layer, backend="kernels",
                                         hidden=chain.padded(e[layer.outputs["hidden"]], real),
                                         residual=chain.padded(e[layer.outputs["residual"]], real),
                                         weights=weights, batch={}, cache={}, layer_idx=layer_idx + 1, real=real,
                                         prepared=prepared, upto=1, rank={"tp_rank": rank}) for e in envs]
            rows = {k: v.detach().cpu()[:real].clone() for k, v in envs[0].items()
                    if isinstance(v, torch.Tensor) and v.dim() and not k.startswith("local:")}
            local = {k: v.detach().cpu().clone() for k, v in envs[0].items() if k.startswith("local:")}
            same = all(_bytes(envs[0][k], pick) == _bytes(envs[1][k], pick) for k in rows)
            same &= all(torch.equal(caches[0][n].cpu().view(torch.uint8), caches[1][n].cpu().view(torch.uint8))
                        for n in caches[0])
            nxt = {f"next.{k}": v.detach().cpu()[:real].clone() for k, v in nexts[0].items()}
            same &= all(_bytes(nexts[0][k], pick) == _bytes(nexts[1][k], pick) for k in nexts[0])
            if rank == 0:  # progress, on the caller's stdout
                print(f"layer_ranks: rank 0 layer {layer_idx} step {s} done at {time.strftime('%H:%M:%S')}", flush=True)
            live = batch["slot_mapping"][:real].cpu()
            written = {n: caches[0][n].cpu().view(-1, *caches[0][n].shape[2:])[live].clone() for n in caches[0]}
            steps_out.append({"rows": {**rows, **nxt}, "local": local, "written": written, "chains_equal": same,
                              "compiles": [str(e) for e in compile_watch.serving_compiles(events)],
                              "seconds": seconds})
        out["layers"][layer_idx] = steps_out
    return out


def _to_device(obj):
    """On a GPU node, every tensor of `obj` (nested dicts / lists / tuples) on this rank's GPU; the emulator's
    device memory is the CPU's."""
    if os.environ.get("AMD_KERNELS_DEVICE") == "emulator":
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.cuda()
    if isinstance(obj, dict):
        return {k: _to_device(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(v) for v in obj)
    return obj


def _bytes(t: torch.Tensor, rows: list) -> bytes:
    return t.detach().cpu()[rows].contiguous().view(torch.uint8).numpy().tobytes()


@contextlib.contextmanager
def _emulator_checks(chain_index: int, seed: int, roots: list):
    """The second chain runs sanitized on the emulator (waits, hazards, races, seeded interleaving); nothing on
    a GPU. Without the memory guard: the attention writes no graph-padding row (its contract leaves them
    unspecified) and the O quantization reads those rows of the fresh tensor, which the guard reports as
    uninitialized reads (harmless to real rows: the quantization works row by row). `roots`: what a guard
    would cover, kept for when the attention writes its padding rows."""
    if chain_index == 0 or os.environ.get("AMD_KERNELS_DEVICE") != "emulator" or \
            os.environ.get("AMD_KERNELS_SANITIZE", "1") == "0":
        yield
        return
    from harness import emulator

    del roots
    with emulator.options(sanitize=True, interleave_seed=seed):
        yield


@contextlib.contextmanager
def _timed(seconds: dict, step):
    start = time.perf_counter()
    yield
    seconds[step.name] = time.perf_counter() - start
