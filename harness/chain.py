"""A decoder layer as a chain of entries, from its declaration in regimes/<model>.toml ([[layer]]).

`load_layer(path, tp)` reads the chain; `run_layer(chain, ...)` runs it once on the kernels or on the
references, every step taking the earlier steps' outputs as they are (the kernels get the prepared weights
from the package's prepare hook, made once per weight set, and MXFP8 activations with their scales, the
cache the previous decode step wrote, the residual stream).

How emulator sampling composes across a chain: a later op reads what an earlier op wrote, so every step
runs whole, except that the ops whose workgroups follow token rows (kernel.toml `workgroups = "tokens"`:
paged attention, MoE) run the workgroups of the real rows only (`real_rows_filter`): the graph-padding rows
they skip are never read as data by a later step of the same layer (attention's padding rows have no keys
and are only quantized and projected row by row; the MoE output is the layer's last op), and the next
decode step refills its padding rows with garbage, as a server's padded batch holds whatever was there.
(The paged attention's filter runs every KV head of a sequence only up to 8192 keys, its package's
EMULATOR_ALL_HEADS_KEYS: chains keep their contexts below that so the O projection reads whole rows.)
The "rows" / "tiles" kernels run every workgroup (a sampled run would leave rows the next op reads
unwritten). So the cost of a chain is that of its real rows; the MoE dominates (each real row runs four
experts).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness import checks, discovery
from harness import device as devices
from references import OPS

SOURCES = ("in", "batch", "cache", "w", "layer", "model", "rank")


@dataclass(frozen=True)
class Step:
    name: str
    kernel: str  # "<category>/<shape token>"
    entry: str
    outputs: tuple
    args: dict  # argument -> source string or number
    aliases: dict = field(default_factory=dict)  # output -> source (an input passed through)


@dataclass(frozen=True)
class Layer:
    tp: int
    phases: tuple
    steps: tuple  # Step, call order
    first_steps: tuple  # the steps of layer 0
    outputs: dict  # "hidden" / "residual" -> "<step>.<output>"
    per_layer: dict  # name -> {"even": v, "odd": v}
    model: dict


def _step(spec: dict, override: dict | None = None) -> Step:
    s = dict(spec, **(override or {}))
    return Step(s["name"], s["kernel"], s["entry"], tuple(s["outputs"]), dict(s["args"]), dict(s.get("aliases", {})))


def load_layer(path: Path | str, tp: int) -> Layer:
    """The [[layer]] chain of `tp` in a regime file, checked: every step's entry exists in its package, every
    argument names a source or an earlier step's output, and the arguments are the reference's."""
    data = tomllib.loads(Path(path).read_text())
    found = [d for d in data.get("layer", []) if d["tp"] == tp]
    if len(found) != 1:
        raise LookupError(f"{path}: {len(found)} [[layer]] tables for tp {tp}")
    spec = found[0]
    steps = tuple(_step(s) for s in spec["steps"])
    first = tuple(_step(s, s.get("first_layer")) for s in spec["steps"])
    layer = Layer(tp, tuple(spec["phases"]), steps, first, dict(spec["outputs"]), dict(spec.get("per_layer", {})),
                  dict(data["model"]))
    problems = validate(layer)
    if problems:
        raise ValueError(f"{path}: [[layer]] tp {tp}: " + "; ".join(problems))
    return layer


def validate(layer: Layer) -> list[str]:
    import inspect

    packages = discovery.discover()
    problems = []
    for steps in (layer.steps, layer.first_steps):
        made = set()
        for st in steps:
            pkg = packages.get(st.kernel)
            if pkg is None or st.entry not in pkg.entries:
                problems.append(f"{st.name}: no entry {st.entry} in kernels/{st.kernel}")
                continue
            ref = OPS[pkg.entries[st.entry]].reference
            params = set(inspect.signature(ref).parameters)
            missing, extra = params - set(st.args) - _defaulted(ref), set(st.args) - params
            if missing or extra:
                problems.append(f"{st.name}: arguments missing {sorted(missing)}, unknown {sorted(extra)}")
            for arg, src in st.args.items():
                if isinstance(src, str):
                    head, _, rest = src.partition(".")
                    if head not in SOURCES and f"{head}.{rest.split('@')[0]}" not in made:
                        problems.append(f"{st.name}.{arg}: {src!r} is no source and no earlier output")
            made |= {f"{st.name}.{o}" for o in (*st.outputs, *st.aliases)}
        for name, src in layer.outputs.items():
            if src not in made:
                problems.append(f"outputs.{name}: {src!r} is no step output")
    return problems


def _defaulted(fn) -> set:
    import inspect

    return {n for n, p in inspect.signature(fn).parameters.items() if p.default is not inspect.Parameter.empty}


def layer_constants(layer: Layer, layer_idx: int) -> dict:
    parity = "even" if layer_idx % 2 == 0 else "odd"
    return {name: values[parity] for name, values in layer.per_layer.items()}


def _resolve(src, env: dict, sources: dict):
    if not isinstance(src, str):
        return src
    flat = src.endswith("@flat")
    src = src.removesuffix("@flat")
    head, _, name = src.partition(".")
    value = sources[head][name] if head in SOURCES else env[src]
    return value.reshape(value.shape[0], -1) if flat else value


@functools.lru_cache(maxsize=None)
def _entry(kernel: str, entry: str):
    pkg = discovery.discover()[kernel]
    return pkg, pkg.import_entries()[entry]


class Prepared:
    """Kernel-side weights: each step's prepare hook run once per weight set (a model does it at load time)."""

    def __init__(self):
        self._cache = {}

    def inputs(self, pkg, st: Step, ref_args: dict) -> dict:
        """The reference's arguments -> the entry's: weights prepared (cached), activations passed as they are."""
        if st.entry not in pkg.prepare:
            return ref_args
        weights = {a for a, s in st.args.items() if isinstance(s, str) and s.startswith("w.")}
        key = (st.kernel, st.entry, tuple(id(ref_args[a]) for a in sorted(weights)))
        if key not in self._cache:
            out = pkg.entry_inputs(st.entry, ref_args)
            self._cache[key] = ({k: v for k, v in out.items() if k not in ref_args or k in weights},
                                [k for k in out if k in ref_args and k not in weights])
        prepared, passed = self._cache[key]
        return {**{k: ref_args[k] for k in passed}, **prepared}


def real_rows_filter(pkg, real: int):
    """Emulator option: a "tokens" package runs the workgroups of rows 0..real-1 (every real row)."""
    chooser = getattr(importlib.import_module(pkg.module), "emulator_workgroups")
    return functools.partial(chooser, frozenset(range(real)))


def run_layer(layer: Layer, *, backend: str, hidden, residual, weights: dict, batch: dict, cache: dict,
              layer_idx: int, real: int | None = None, order_seed: int | None = None,
              prepared: Prepared | None = None, local: bool = False, upto: int | None = None,
              around_step=None, references: dict | None = None, rank: dict | None = None) -> dict:
    """One pass of the chain -> {"<step>.<output>": tensor}. backend "reference": the ops' references (the
    caller passes real rows only); "kernels": the package entries on the executing device, `cache` written
    in place; on the emulator with workgroups in `order_seed` order, "tokens" packages on the real rows.
    local: also "local:<step>.<output>", the op's reference on the real rows of the kernel's own inputs
    (and "local:<step>.<mutated argument>", e.g. the cache the reference wrote from the same bytes).
    upto: run only the first `upto` steps (e.g. 1: the next layer's add + norm on this layer's outputs).
    around_step(step): a context manager entered around each kernel call (e.g. to record its launches).
    references: step name -> a function used instead of that step's reference (backend "reference"; e.g.
    references.attention.paged_attention_p_bf16 for the chain bound); with `local`, also the local reference
    (None: no local reference for that step, e.g. an all-reduce, whose reference needs every rank's input).
    rank: the "rank.<x>" source (TP > 1: {"tp_rank": r})."""
    steps = (layer.first_steps if residual is None else layer.steps)[:upto]
    sources = {"in": {"hidden": hidden, "residual": residual}, "batch": batch, "cache": cache, "w": weights,
               "layer": layer_constants(layer, layer_idx), "model": layer.model, "rank": rank or {}}
    env = {}
    for st in steps:
        pkg, entry = _entry(st.kernel, st.entry)
        args = {a: _resolve(s, env, sources) for a, s in st.args.items()}
        op = OPS[pkg.entries[st.entry]]
        if backend == "reference":
            outs = (references or {}).get(st.name, op.reference)(**args)
        else:
            local_args = _local_args(op, args, real) if local else None
            prepared = prepared if prepared is not None else Prepared()
            with (around_step(st) if around_step else contextlib.nullcontext()):
                outs = _call_kernel(pkg, entry, prepared.inputs(pkg, st, args), real, order_seed)
            local_ref = (references or {}).get(st.name, op.reference)
            if local and local_ref is not None:  # the reference on this chain's own inputs: a kernel's error alone
                lo = local_ref(**local_args)
                env.update({f"local:{st.name}.{o}": t for o, t in zip(st.outputs, lo)})
                env.update({f"local:{st.name}.{m}": local_args[m] for m in op.mutates})
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        if len(outs) != len(st.outputs):
            raise ValueError(f"{st.name}: {len(outs)} outputs, the declaration names {st.outputs}")
        env.update({f"{st.name}.{o}": t for o, t in zip(st.outputs, outs)})
        env.update({f"{st.name}.{o}": _resolve(s, env, sources) for o, s in st.aliases.items()})
    return env


def _local_args(op, args: dict, real: int) -> dict:
    """CPU copies of a step's arguments for its reference: the op's token-row inputs cut to the real rows,
    the arguments it mutates cloned before the kernel writes them."""
    out = {}
    for name, v in args.items():
        if isinstance(v, torch.Tensor):
            v = v.detach().cpu()
            v = v[:real] if name in op.row_inputs else v
            v = v.clone() if name in op.mutates else v
        out[name] = v
    return out


def _call_kernel(pkg, entry, inputs: dict, real, order_seed):
    dev = devices.current()
    if not dev.emulated:
        return entry(**inputs)
    from harness import emulator

    opts = {"workgroup_order_seed": order_seed}
    if pkg.workgroups == "tokens" and real is not None:
        opts["workgroup_filter"] = real_rows_filter(pkg, real)
    with emulator.options(**opts):
        return entry(**inputs)


def padded(t: torch.Tensor, real: int) -> torch.Tensor:
    """`t` with rows real.. refilled with garbage (what a padded batch holds), as a new tensor."""
    return checks.fill_padding({"t": t}, ("t",), real, True)["t"] if real < t.shape[0] else t.clone()


def run_layer_ranks(layer: Layer, *, hidden: list, residual: list | None, weights: list, batch: dict,
                    caches: list, layer_idx: int, references: list | None = None, upto: int | None = None) -> list:
    """The TP chain on the references in one process -> one env per rank: each step runs on every rank in turn
    (rank r's shard: weights[r], caches[r], hidden[r]), a multi-rank step's reference (an all-reduce) is called
    once on the ranks' stacked partials `x` and every rank gets its result. references[r]: as run_layer's."""
    world = len(weights)
    steps = (layer.first_steps if residual is None else layer.steps)[:upto]
    sources = [{"in": {"hidden": hidden[r], "residual": None if residual is None else residual[r]}, "batch": batch,
                "cache": caches[r], "w": weights[r], "layer": layer_constants(layer, layer_idx),
                "model": layer.model, "rank": {"tp_rank": r}} for r in range(world)]
    envs = [{} for _ in range(world)]
    for st in steps:
        pkg, _ = _entry(st.kernel, st.entry)
        op = OPS[pkg.entries[st.entry]]
        args = [{a: _resolve(s, envs[r], sources[r]) for a, s in st.args.items()} for r in range(world)]
        if pkg.ranks > 1:
            if pkg.ranks != world:
                raise ValueError(f"{st.name}: kernels/{st.kernel} runs on {pkg.ranks} ranks, the chain on {world}")
            outs = op.reference(**{**args[0], "x": torch.stack([a["x"] for a in args])})
            per_rank = [outs] * world
        else:
            per_rank = [((references or [None] * world)[r] or {}).get(st.name, op.reference)(**args[r])
                        for r in range(world)]
        for r, outs in enumerate(per_rank):
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            envs[r].update({f"{st.name}.{o}": t for o, t in zip(st.outputs, outs)})
            envs[r].update({f"{st.name}.{o}": _resolve(s, envs[r], sources[r]) for o, s in st.aliases.items()})
    return envs
