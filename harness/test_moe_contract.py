"""Targeted checks of the MXFP4 MoE packages' contract (references/moe.py) that the generated cases cannot
see: TP8 partials summed over the ranks against TP1, a row's bits the same in both gate-up tiers (batch
invariance at the tier boundary), a w13 scale byte 255 giving the reference's NaN row, and the token-count
limit. The kernel cases run a few tokens (emulator or GPU) and are heavy (every selected expert's weights
go through emulated MFMAs): run this file alone, without -n."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

from harness import checks, discovery
from harness import device as devices
from references import OPS
from references.moe import MOE_COSINE_MIN

GPTOSS = {"hidden": 2880, "intermediate": 2880, "experts": 128, "top_k": 4}
TP8 = "moe/mxfp4_h2880_i384_e128_top4"
PACKAGES_OPS = {"moe/mxfp4_h2880_i2880_e128_top4": "moe_mxfp4_gptoss", TP8: "moe_mxfp4_gptoss",
                "moe/mxfp4_h6144_i768_e128_top4": "moe_mxfp4_swiglu"}
MOE_PACKAGES = sorted(PACKAGES_OPS)


@functools.lru_cache(maxsize=None)
def _entry(package: str, op: str):
    pkg = discovery.discover()[package]
    name = pkg.entry_for_op(op)
    return pkg, name, pkg.import_entries()[name]


def run(package: str, op: str, raw: dict) -> torch.Tensor:
    """The package's entry on reference inputs (checkpoint layout, prepared by the package), on the device."""
    pkg, name, entry = _entry(package, op)
    inputs = checks.to_device(pkg.entry_inputs(name, raw), devices.current().torch_device)
    return entry(**inputs).cpu()


def test_tp8_rank_partials_sum_to_tp1():
    """vLLM all-reduces the 8 ranks' partials: summed in rank order they match the TP1 reference (a sum
    order change and the partials' bf16 rounding, so by cosine, not bitwise)."""
    op = OPS["moe_mxfp4_gptoss"]
    tokens = 3
    total = torch.zeros(tokens, GPTOSS["hidden"])
    for rank in range(8):
        raw = op.build_inputs(tokens, {**GPTOSS, "tp_size": 8, "tp_rank": rank}, 11)
        total += run(TP8, "moe_mxfp4_gptoss", raw).float()
    (tp1,) = op.reference(**op.build_inputs(tokens, {**GPTOSS, "tp_size": 1, "tp_rank": 0}, 11))
    assert checks.cosine(total, tp1.float()) >= MOE_COSINE_MIN


def _kernel_module(package: str):
    pkg = discovery.discover()[package]
    return importlib.import_module(pkg.module)


@pytest.mark.parametrize("package", MOE_PACKAGES)
def test_token_count_above_the_limit_is_refused(package):
    """Masked stores aim at an offset just below 2 GiB (buffer.never_in_range): a buffer past it would be
    written there. Each package names its limit, which covers the regimes' largest prefill (8192 tokens)
    and keeps its largest per-pair buffer (y, k bf16 rows per token) below that offset."""
    pipeline = _kernel_module(package).PIPELINE
    limit, hidden = pipeline.max_tokens, pipeline.weight_shapes()["w2_bias"][1]
    top_k = 4
    assert 8192 <= limit and limit * top_k * hidden * 2 < 0x7FFFFFF0
    pkg, name, entry = _entry(package, PACKAGES_OPS[package])
    dev = devices.current().torch_device
    m = limit + 1
    args = dict(x=torch.empty(m, hidden, dtype=torch.bfloat16, device=dev),
                topk_weights=torch.empty(m, top_k, device=dev),
                topk_ids=torch.empty(m, top_k, dtype=torch.int32, device=dev))
    for k, shape in pipeline.weight_shapes().items():  # untouched pages: no memory is committed
        args[k] = torch.empty(shape, dtype=pipeline.weight_dtypes[k], device=dev)
    with pytest.raises(ValueError, match=rf"^x: {m} tokens, more than this MoE's limit of {limit}"):
        entry(**args)


def _cancelling(raw: dict, lo_block: int, hi_block: int, big: float) -> dict:
    """Row 0 of x gets `big` over two 32-element K-blocks and its experts' w13 codes over the second block
    are the first block's negated: the two blocks' products cancel exactly, leaving a sum whose fp32 bits
    depend on the order the K partials are added in (the tiers' grouping)."""
    raw = dict(raw)
    x = raw["x"].clone()
    x[0, 32 * lo_block: 32 * lo_block + 32] = big
    x[0, 32 * hi_block: 32 * hi_block + 32] = big
    blocks, scales = raw["w13_blocks"].clone(), raw["w13_scales"].clone()
    for e in raw["topk_ids"][0].tolist():
        blocks[e, :, 16 * hi_block: 16 * hi_block + 16] = blocks[e, :, 16 * lo_block: 16 * lo_block + 16] ^ 0x88
        scales[e, :, hi_block] = scales[e, :, lo_block]
    raw.update(x=x, w13_blocks=blocks, w13_scales=scales)
    return raw


def _tier_edges(variant_for, largest: int) -> list[int]:
    """Token counts m whose variant differs from m - 1's, up to `largest`."""
    return [m for m in range(2, largest + 1) if variant_for(m) != variant_for(m - 1)]


@pytest.mark.parametrize("package", MOE_PACKAGES)
def test_batch_invariance_counts_straddle_every_tier_edge(package):
    """test_batch_invariance proves a row's bits do not depend on the tier its batch picks only at the counts
    it runs: both sides of every tier edge of the moe entry (and of the routed entry, where its counts are
    not kernel.toml's emulated list) must be among them, wherever a package moves its thresholds."""
    from harness import cases

    pkg = discovery.discover()[package]
    module = _kernel_module(package)
    pipeline = module.PIPELINE
    largest = max(c.tokens for s in cases.op_shapes() if s.kernel == package for c in s.token_counts)
    entries = {PACKAGES_OPS[package]: pipeline.variant_for}
    if hasattr(module, "routed"):
        routed_from = module._built.routed_prefill_from
        entries["moe_routed_mxfp4_gptoss"] = lambda m: pipeline.variant_for(m, routed_from)
    for op, variant_for in entries.items():
        edges = _tier_edges(variant_for, largest)
        assert edges, f"{package} {op}: one tier at every count?"
        if op != PACKAGES_OPS[package] and devices.current().emulated and op in pkg.emulator_op_invariance_counts:
            continue  # the routed entry's emulated list: its kernel.toml comment names the tests that cover the rest
        counts = set(checks.invariance_counts(pkg, largest, op))
        missing = [(m - 1, m) for m in edges if not {m - 1, m} <= counts]
        assert not missing, f"{package} {op}: tier edges {missing} are not in the batch-invariance counts"


@pytest.mark.parametrize("package,op,dims,small,full", [
    (TP8, "moe_mxfp4_gptoss", {**GPTOSS, "tp_size": 8, "tp_rank": 0}, 5, 6),
    ("moe/mxfp4_h6144_i768_e128_top4", "moe_mxfp4_swiglu",
     {"hidden": 6144, "intermediate": 768, "experts": 128, "top_k": 4}, 2, 3),
])
def test_a_row_has_the_same_bits_in_both_gate_up_tiers(package, op, dims, small, full):
    """The smallest token counts take the small-M gate-up (more waves per workgroup, fewer K-steps each);
    one more token takes the full one. Row 0, the same in both batches, must come out bit-identical even
    on an input built so that the order of K's partial sums shows (cancellation in K-steps 4-7 and 12-15,
    which each tier holds in different waves)."""
    pipeline = _kernel_module(package).PIPELINE
    assert (pipeline.variant_for(small), pipeline.variant_for(full)) == ("moe.small_m", "moe.full")
    raw = _cancelling(OPS[op].build_inputs(full, dims, 21), lo_block=16, hi_block=48, big=2.0 ** 26)
    part = dict(raw, x=raw["x"][:small].contiguous(), topk_weights=raw["topk_weights"][:small].contiguous(),
                topk_ids=raw["topk_ids"][:small].contiguous())
    out_full, out_small = run(package, op, raw), run(package, op, part)
    assert torch.isfinite(out_full[0].float()).all()
    assert torch.equal(checks.row_bytes(out_full)[0], checks.row_bytes(out_small)[0])


def test_a_w13_scale_byte_255_gives_the_reference_nan_row():
    """E8M0 255 is NaN: the expert's gate/up value is NaN, the gpt-oss clamps keep it (as torch.clamp does),
    and every output of a token routed to that expert is NaN; a token not routed to it is untouched."""
    op = OPS["moe_mxfp4_gptoss"]
    raw = dict(op.build_inputs(2, {**GPTOSS, "tp_size": 8, "tp_rank": 0}, 31))
    e = int(raw["topk_ids"][0, 0])
    ids = raw["topk_ids"].clone()
    others = [i for i in range(128) if i not in ids[0].tolist()]
    ids[1] = torch.tensor(others[:4], dtype=torch.int32)
    scales = raw["w13_scales"].clone()
    scales[e, 2 * 5, 3] = 255  # the gate row of column 5 (rank 0's), K-block 3
    raw.update(topk_ids=ids, w13_scales=scales)
    (ref,) = op.reference(**raw)
    assert ref[0].isnan().all() and torch.isfinite(ref[1].float()).all()
    out = run(TP8, "moe_mxfp4_gptoss", raw)
    assert out[0].isnan().all() and torch.isfinite(out[1].float()).all()
