"""The decode chain's bound, derived: what the kernels' own rounding point explains, over seeds.

The per-op checks hold each kernel to its reference on its own inputs. Along a chain the two chains' inputs
part: wherever a kernel rounds where its reference does not, the next ops see other inputs, and every later
MXFP8 quantization (the O projection's input, the MoE's input and its intermediate) turns a one-ulp input
change into whole E4M3 steps on some codes. The largest such rounding point of the decode chain is the
attention's P rounded to bf16 before P V (references/attention.py's contract: "the largest term"); every other
op matches its reference to cosine 1.0000000 on its own inputs (fp32 sums in another order, a rare last-bit
change), and the quantizations themselves are in both chains.

So, per seed, this runs the reference chain twice over the test's decode run (harness/test_layer.py:
LAYER_CONTEXTS at LAYER_TOKENS rows, LAYER_STEPS steps, window and full layer): once as it is and once with
attention.paged_attention_p_bf16 in place of the attention reference, and records 1 - cosine of the layer
output and of the residual stream between the two, per step. Seed 0 is the test's own run (its run and step
seeds); seeds 1.. draw other hidden states, residuals and caches (the weights are the test's).

The bound on the kernel chain's 1 - cosine, per layer kind and quantity: max + 3 std of those samples (the
kernel chain is one more draw of the same rounding, realized with running block maxima instead of the row
max, plus rare last-bit changes elsewhere; 3 std over the largest sample is the margin for that).

  ./env.sh python3 -m harness.layer_bound [--seeds 6] [--tp 8] [--prefill]   (about 100 s per decode seed on one core)

--prefill derives the chunked-prefill chain's bound (harness/test_layer_prefill.py) the same way on its run
(PREFILL_PREFIXES, PREFILL_Q_LENS; seeds 1.. draw other caches and inputs), over the rows that chain samples.
The prefill tier rounds where the decode tier does (references/attention.py: scores and the running max,
sums and division in fp32, P rounded to bf16 before P V), so the same modelled chain covers it; the
difference is the rows: 33-40 query rows per chunk, whose keys include the chunk's own rows.

At --tp 8 the second chain is the TP8 chain on the references (each rank's shard, the all-reduces' rank-order
fp32 sums of bf16 partials) with P rounded to bf16, against the TP1 reference chain: the TP8 kernel chain's
bound, the partials' roundings included.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from harness import chain, checks
from harness.toolchain import REPO
from references import allreduce, attention, cosine, moe
from references import layer as ref_layer
from references.norm import build_inputs as norm_inputs

REGIME = REPO / "regimes" / "gpt_oss_120b.toml"
TOKENS = 4  # harness/test_layer.py's LAYER_TOKENS, LAYER_CONTEXTS, LAYER_STEPS
CONTEXTS = [62, 127, 1000]
STEPS = 2
# The chunked-prefill run (harness/test_layer_prefill.py; references/layer.py build_prefill_run): a prompt in two
# chunks (40 rows without a cached prefix, then 33 rows reading the first chunk from the cache), a 33-row chunk
# after a 1000-key cached prefix followed by its first decode token, and a decode sequence at the window's edge.
# Q tiles are 32 rows: 33 and 40 rows end in a partial tile.
PREFILL_PREFIXES = [0, 1000, 127]
PREFILL_Q_LENS = [[40, 33], [33, 1], [1, 1]]


def run_seeds(i: int) -> tuple[int, callable]:
    """(run seed, step -> step-input seed) of seed index i; index 0 is harness/test_layer.py's."""
    if i == 0:
        return checks.seed_of("layer-run"), lambda s: checks.seed_of("layer-step", s)
    return checks.seed_of("layer-run", i), lambda s: checks.seed_of("layer-step", s, i)


def prefill_run(i: int) -> dict:
    """Seed index i's chunked-prefill run (index 0: harness/test_layer_prefill.py's)."""
    return ref_layer.build_prefill_run(PREFILL_PREFIXES, PREFILL_Q_LENS, seed=checks.seed_of("layer-prefill", i)
                                       % 1_000_000)


def sampled_rows(run: dict, s: int) -> list[int]:
    """The rows a prefill chain's "tokens" steps run and its checks compare at step s (harness/chain.py): every
    decode row, and of each prefill chunk its first and last row (so its first and its last, partial, Q tile:
    the whole chunk at 33-40 rows; the MoE's emulation cost is per sampled row)."""
    rows = []
    for b, start in enumerate(run["starts"][s]):
        n = PREFILL_Q_LENS[b][s]
        rows += sorted({start, start + n - 1})
    return rows


def step_inputs(run: dict, s: int, layer_idx: int, step_seed) -> tuple:
    """The layer's (hidden, residual) at step s, as harness/test_layer.py builds them (all TOKENS rows)."""
    if s == 0:
        hidden, residual = run["hidden"], run["residual"]
    else:
        x = norm_inputs(TOKENS, {"hidden": ref_layer.HIDDEN, "eps": ref_layer.EPS}, step_seed(s),
                        with_residual=True)
        hidden, residual = x["x"], x["residual"]
    return hidden, (None if layer_idx == 0 else residual)


def tp_inputs(hidden: torch.Tensor, residual, layer_idx: int, tp: int, seed: int) -> tuple[list, torch.Tensor]:
    """(each rank's in.hidden, the TP1 chain's in.hidden): the first layer's input is the embedding, whole on
    every rank; a later layer's is the previous layer's MoE output, one partial per rank (hidden / tp plus
    seeded noise ~ N(0, 0.05), bf16), whose sum the TP1 chain gets (references.allreduce: fp32 in rank order,
    bf16 once)."""
    if residual is None or tp == 1:
        return [hidden] * tp, hidden
    gen = torch.Generator().manual_seed(seed)
    parts = [(hidden.float() / tp + 0.05 * torch.randn(hidden.shape, generator=gen)).to(torch.bfloat16)
             for _ in range(tp)]
    return parts, allreduce.allreduce(torch.stack(parts))[0]


def routing_split(ids_a: torch.Tensor, ids_b: torch.Tensor) -> torch.Tensor:
    """bool [rows]: the two chains chose the same set of experts for the row (the order within the k is the
    logits', which the softmax weights carry)."""
    return torch.tensor([set(a.tolist()) == set(b.tolist()) for a, b in zip(ids_a, ids_b)], dtype=torch.bool)


def _ulp_bf16(v: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.floor(torch.log2(v.abs().clamp(min=2.0**-126))) - 7)


def unexplained_flips(x_a, x_b, ids_a, ids_b, router_weight, router_bias) -> list[str]:
    """Rows whose expert sets differ although the router inputs could not have swapped them. Chain b is the
    reference chain. For experts a (b's choice, not a's) and e (a's choice, not b's), a swap needs
    logit_b[a] - logit_b[e] <= |(x_a - x_b) . w_a| + |(x_a - x_b) . w_e| + one bf16 ulp of each logit (the
    input difference moves each logit by at most that dot product; the kernel's fp32 sum order, by at most
    the last bit of the bf16 logit). Exact per row, no statistics."""
    logits = moe.router_logits(x_b, router_weight, router_bias).double()
    delta = (x_a.double() - x_b.double()) @ router_weight.double().T  # [rows, E]
    ulp = _ulp_bf16(logits)
    out = []
    for r in torch.nonzero(~routing_split(ids_a, ids_b)).flatten().tolist():
        gone = set(ids_b[r].tolist()) - set(ids_a[r].tolist())
        came = set(ids_a[r].tolist()) - set(ids_b[r].tolist())
        for a in gone:
            for e in came:
                gap = float(logits[r, a] - logits[r, e])
                room = float(delta[r, a].abs() + delta[r, e].abs() + ulp[r, a] + ulp[r, e])
                if gap > room:
                    out.append(f"row {r}: expert {e} replaced {a} with a logit gap {gap:.4g} > {room:.4g}")
    return out


def expert_ids(env: dict, weights: dict, rows=slice(None)) -> torch.Tensor:
    """int32 [rows, k]: the experts the router's reference picks for `rows` on a chain's MoE input
    (mlp_norm.out): a reference chain's routing. A kernel chain's own (its routed MoE step outputs no ids) is the
    route kernel's on the same input (harness/test_layer.py: _kernel_expert_ids)."""
    x = env["mlp_norm.out"].detach().cpu()[rows]
    return moe.moe_route_softmax_topk(x, weights["router_weight"], weights["router_bias"], ref_layer.TOP_K)[1]


def chain_drift(layer, env_a: dict, env_b: dict, weights: dict, real: int | None = None,
                rows: list | None = None, ids_a: torch.Tensor | None = None) -> dict:
    """Chain a against chain b (the reference chain): {"agree": rows with the same experts (expert_ids; `ids_a`:
    chain a's own, e.g. the route kernel's for a kernel chain),
    "output": 1 - cosine of the layer output on those rows, "residual": 1 - cosine of the residual stream (all
    rows)}; over `rows` only when given (a prefill chain's sampled rows), else the first `real`."""
    rows = slice(None, real) if rows is None else torch.tensor(rows, dtype=torch.long)
    ids_b = expert_ids(env_b, weights, rows)
    ids_a = expert_ids(env_a, weights, rows) if ids_a is None else ids_a
    agree = routing_split(ids_a, ids_b)
    out_a, out_b = (e[layer.outputs["hidden"]].detach().cpu()[rows].float() for e in (env_a, env_b))
    res_a, res_b = (e[layer.outputs["residual"]].detach().cpu()[rows].float() for e in (env_a, env_b))
    return {"agree": agree,
            "output": 1.0 - cosine(out_a[agree], out_b[agree]) if agree.any() else float("nan"),
            "residual": 1.0 - cosine(res_a, res_b)}


def partial_seed(step_seed, s: int) -> int:
    return step_seed(s) + 7919


def tp_env(layer, envs: list) -> dict:
    """A TP chain's per-rank envs -> the layer outputs chain_drift reads, in TP1 form: the MoE partials summed
    (references.allreduce), the replicated steps' rank 0 values."""
    out = dict(envs[0])
    out[layer.outputs["hidden"]] = allreduce.allreduce(torch.stack([e[layer.outputs["hidden"]] for e in envs]))[0]
    return out


def drift(layer, weights: dict, i: int, layer_idx: int, tp: int = 1, prefill: bool = False) -> list[dict]:
    """Per step, chain_drift of the reference chain with P rounded to bf16 (at TP > 1: the TP chain on the
    ranks' shards, harness/chain.run_layer_ranks, with its partials' bf16 roundings and rank-order sums)
    against the TP1 reference chain, on seed index i's decode run (prefill: its chunked-prefill run, over the
    sampled rows), plus "flips": its routing changes the logit rule above does not explain."""
    run_seed, step_seed = run_seeds(i)
    if prefill:
        run = prefill_run(i)
        steps = [(b, run["reals"][s], len(PREFILL_PREFIXES), sampled_rows(run, s))
                 for s, b in enumerate(run["batches"])]
    else:
        run = ref_layer.build_decode_run(TOKENS, CONTEXTS, STEPS, seed=run_seed)
        steps = [(b, run["real"], run["real"], None) for b in run["batches"]]
    tp_layer = chain.load_layer(REGIME, tp) if tp > 1 else None
    shards = [ref_layer.shard_layer_weights(weights, r, tp) for r in range(tp)] if tp > 1 else None
    caches = [{"key": run["key_cache"].clone(), "value": run["value_cache"].clone()} for _ in range(2)]
    tp_caches = [{n: ref_layer.shard_cache(run[f"{n}_cache"], r, tp) for n in ("key", "value")} for r in range(tp)]
    out = []
    for s, (batch, real, seqs, rows) in enumerate(steps):
        if prefill:
            hidden, residual = run["inputs"][s]
            residual = None if layer_idx == 0 else residual
        else:
            hidden, residual = step_inputs(run, s, layer_idx, step_seed)
        hidden, residual = hidden[:real], None if residual is None else residual[:real]
        parts, hidden1 = tp_inputs(hidden, residual, layer_idx, tp, partial_seed(step_seed, s))
        rb = ref_layer.real_batch(batch, real, seqs)
        envs = [chain.run_layer(layer, backend="reference", hidden=hidden1, residual=residual, weights=weights,
                                batch=rb, cache=caches[0], layer_idx=layer_idx, rows=rows)]
        if tp == 1:
            envs.append(chain.run_layer(layer, backend="reference", hidden=hidden1, residual=residual,
                                        weights=weights, batch=rb, cache=caches[1], layer_idx=layer_idx,
                                        references={"attn": attention.paged_attention_p_bf16}, rows=rows))
        else:
            envs.append(tp_env(layer, chain.run_layer_ranks(
                tp_layer, hidden=parts, residual=None if residual is None else [residual] * tp, weights=shards,
                batch=rb, caches=tp_caches, layer_idx=layer_idx, rows=rows,
                references=[{"attn": attention.paged_attention_p_bf16, "moe": ref_layer.routed_rank_reference(r)}
                            for r in range(tp)])))
        d = chain_drift(layer, envs[1], envs[0], weights, rows=rows)
        pick = slice(None) if rows is None else torch.tensor(rows, dtype=torch.long)
        d["flips"] = unexplained_flips(envs[1]["mlp_norm.out"][pick], envs[0]["mlp_norm.out"][pick],
                                       expert_ids(envs[1], weights, pick), expert_ids(envs[0], weights, pick),
                                       weights["router_weight"], weights["router_bias"])
        out.append(d)
    return out


def bound(samples: list[float]) -> float:
    """The bound on 1 - cosine from samples of it: max + 3 std."""
    return max(samples) + 3 * statistics.pstdev(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--tp", type=int, default=1, help="8: the TP8 chain on 8 shards against the TP1 chain")
    parser.add_argument("--layer-idx", type=int, choices=(0, 1), default=None,
                        help="one layer kind only (0 window / first layer, 1 full); default both")
    parser.add_argument("--prefill", action="store_true", help="the chunked-prefill run (PREFILL_*) in place of "
                        "the decode run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    layer = chain.load_layer(REGIME, 1)
    print(f"TP{args.tp} chain with P rounded to bf16 against the TP1 reference chain, "
          f"{'chunked-prefill' if args.prefill else 'decode'} run", flush=True)
    weights = ref_layer.build_layer_weights(checks.seed_of("layer-weights"))
    if args.tp > 1:  # every seed cuts the 8 shards: from experts drawn once (a lazy shard draws all of w2)
        weights = ref_layer.drawn_experts(weights)
    for layer_idx, kind in ((0, "window (first layer)"), (1, "full")):
        if args.layer_idx not in (None, layer_idx):
            continue
        samples = {"output": [], "residual": []}
        for i in range(args.seeds):
            for s, d in enumerate(drift(layer, weights, i, layer_idx, args.tp, args.prefill)):
                print(f"{kind} seed {i} step {s}: same experts {int(d['agree'].sum())}/{len(d['agree'])} rows, "
                      f"output {d['output']:.3e} residual {d['residual']:.3e}"
                      + (f"  UNEXPLAINED {d['flips']}" if d["flips"] else ""), flush=True)
                for name in samples:
                    if d[name] == d[name]:  # not NaN (no agreeing row)
                        samples[name].append(d[name])
        for name, v in samples.items():
            print(f"{kind} {name}: n {len(v)} mean {statistics.fmean(v):.3e} std {statistics.pstdev(v):.3e} "
                  f"max {max(v):.3e} -> bound 1 - cosine <= {bound(v):.3e} (cosine >= {1 - bound(v):.7f})",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
