"""The per-test memory limit of conftest.py (harness/memory.py): a test whose peak RSS passes
AMD_KERNELS_TEST_RSS_LIMIT_MIB fails naming itself and the figure, the next test is measured from its own
start, and a bad value of the variable is named."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from harness import memory
from harness.toolchain import REPO

HOLD_ENV = "AMD_KERNELS_TEST_HOLD_MIB_ABOVE_LIMIT"
KEEP_ENV = "AMD_KERNELS_TEST_KEEP_HELD"
_HELD = []


@pytest.mark.skipif(HOLD_ENV not in os.environ, reason="run by test_a_test_above_the_limit_fails")
def test_holds_memory():
    """Set the limit 128 MiB above this process's RSS, then touch memory until the RSS is the given MiB above
    the limit (negative: below it). conftest reads the limit after the test."""
    limit = memory.status_kib("VmRSS") // 1024 + 128
    os.environ[memory.LIMIT_ENV] = str(limit)
    target = (limit + int(os.environ[HOLD_ENV])) * 1024 * 1024
    held = bytearray(max(0, target - memory.status_kib("VmRSS") * 1024))
    for i in range(0, len(held), 4096):
        held[i] = 1
    if os.environ.get(KEEP_ENV):
        _HELD.append(held)  # still resident during the next test, as a shape's cached weights are
    assert memory.status_kib("VmRSS") * 1024 >= target - (8 << 20)
    print(f"limit {limit} MiB")


@pytest.mark.skip(reason="skipped while test_holds_memory's memory is still resident (VmHWM restarts from that "
                         "RSS): a skipped test allocated nothing, so the limit is not its failure")
def test_skipped_while_it_is_held():
    """Never runs (run by test_a_test_above_the_limit_fails)."""


@pytest.mark.skipif(HOLD_ENV not in os.environ, reason="run by test_a_test_above_the_limit_fails")
def test_after_it():
    """Measured from its own start: the memory test_holds_memory held is not counted here."""


def _run(above_mib: int, keep: bool = False, peak_log: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, HOLD_ENV: str(above_mib), **({KEEP_ENV: "1"} if keep else {}), memory.PEAK_LOG_ENV: peak_log}
    after = "test_skipped_while_it_is_held" if keep else "test_after_it"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           f"{__file__}::test_holds_memory", f"{__file__}::{after}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_a_test_above_the_limit_fails():
    over = _run(64)
    limit = re.search(r"limit (\d+) MiB", over.stdout)
    # reported at the test's teardown (its fixtures' memory counts): an error; the next test passes
    assert limit and "2 passed, 1 error" in over.stdout, over.stdout + over.stderr
    assert re.search(rf"test_memory.py::test_holds_memory: this test process \(pid \d+\) reached a peak RSS of "
                     rf"\d+ MiB, above the limit of {limit[1]} MiB", over.stdout), over.stdout
    under = _run(-64)
    assert "2 passed in" in under.stdout, under.stdout + under.stderr
    held = _run(64, keep=True)  # the memory stays resident through a skipped test: only the holder errors
    assert "1 passed, 1 skipped, 1 error" in held.stdout, held.stdout + held.stderr


def test_peak_log(tmp_path):
    """AMD_KERNELS_TEST_PEAK_LOG: one line per test that ran, its id, pid, peak (KiB), wall and CPU seconds;
    the holder's peak above the RSS it held."""
    log = tmp_path / "peaks.txt"
    run = _run(-64, peak_log=str(log))
    assert "2 passed in" in run.stdout, run.stdout + run.stderr
    held_mib = int(re.search(r"limit (\d+) MiB", run.stdout)[1]) - 64
    lines = [line.split() for line in log.read_text().splitlines()]
    assert [line[0].split("::")[1] for line in lines] == ["test_holds_memory", "test_after_it"], lines
    assert lines[0][1] == lines[1][1] and int(lines[0][2]) >= (held_mib - 8) * 1024, (held_mib, lines)
    assert all(len(line) == 5 and float(line[3]) >= 0 and float(line[4]) >= 0 for line in lines), lines


def test_a_bad_limit_is_named(monkeypatch):
    monkeypatch.setenv(memory.LIMIT_ENV, "4G")
    with pytest.raises(ValueError, match=memory.LIMIT_ENV):
        memory.limit_mib()
    monkeypatch.setenv(memory.LIMIT_ENV, "0")
    assert memory.limit_mib() == 0


def test_lazy_moe_checkpoint_is_the_eager_one_bit_for_bit():
    """The MoE builder's checkpoint (references.moe.LazyExperts, regenerated expert by expert where used) holds
    the same bytes as the eager builder's, through each access prepare_weights and the reference make (an
    expert, a range of experts, after slicing another dim, fancy indexing, a whole-tensor op), and the prepared
    weights and the reference output made from it are the same bytes."""
    import torch

    import references.moe as M
    from amd_kernels.moe import prepare as P

    key = (256, 1152, 8, True, 77)  # small dims, the same code path as gpt-oss's (w13 rows span row blocks)
    eager, lazy = M._weights.__wrapped__(*key), M._lazy_weights.__wrapped__(*key)
    assert eager.keys() == lazy.keys()
    for name, want in eager.items():
        got = lazy[name]
        assert (got.shape, got.dtype) == (want.shape, want.dtype), name
        if not isinstance(got, M.LazyExperts):
            assert torch.equal(got, want), name
            continue
        assert torch.equal(got.materialize(), want), name
        assert torch.equal(got[5], want[5]) and torch.equal(got[-1], want[-1]), name
        assert torch.equal(got[2:6], want[2:6]) and torch.equal(got[6:], want[6:]), name
        assert torch.equal(got[:, :, 2:4][1:3], want[:, :, 2:4][1:3]), name
        for r0, r1 in ((0, 3), (1, 7), (300, 800), (5, want.shape[1])):  # row ranges (TP shards): slice, index
            assert torch.equal(got[:, r0:r1], want[:, r0:r1]), name
            assert torch.equal(got[2:5][:, r0:r1][:, 1:], want[2:5][:, r0:r1][:, 1:]), name
            assert torch.equal(got[:, torch.arange(r0, r1)], want[:, r0:r1]), name
        rows = torch.tensor([7, 1, 4])
        assert torch.equal(got[:, rows], want[:, rows]) and torch.equal(got[3:5][:, rows], want[3:5][:, rows]), name
        assert torch.equal(got.clone(), want) and torch.equal(got ^ 0x88, want ^ 0x88), name
    names = ("w13_blocks", "w13_scales", "w13_bias", "w2_blocks", "w2_scales", "w2_bias")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 256, generator=gen).to(torch.bfloat16)
    weights, ids = M.build_routing(5, 8, 4, gen)
    for tp, rank in ((1, 0), (2, 1), (8, 3)):
        args = dict(activation="gptoss", hidden=256, intermediate=1152, experts=8, tp_size=tp, tp_rank=rank)
        a = P.prepare_weights(*(eager[n] for n in names), **args)
        b = P.prepare_weights(*(lazy[n] for n in names), **args)
        assert all(torch.equal(a[k], b[k]) for k in a)
        (ra,) = M.moe_mxfp4_gptoss(x, weights, ids, *(eager[n] for n in names), tp_size=tp, tp_rank=rank)
        (rb,) = M.moe_mxfp4_gptoss(x, weights, ids, *(lazy[n] for n in names), tp_size=tp, tp_rank=rank)
        assert torch.equal(ra.view(torch.int16), rb.view(torch.int16))


def test_layer_checkpoint_is_lazy_and_its_shards_plain():
    """The decoder layer's weights (references.layer.build_layer_weights, what the TP1 layer chains run on) hold
    their experts as the MoE builder's lazy checkpoint (the tensors proven the eager builder's bytes above), not
    1.7 GB resident; a TP shard (shard_layer_weights, saved for the rank processes) is ordinary tensors holding
    the shard's bytes of that checkpoint."""
    import io

    import torch

    import references.layer as L
    import references.moe as M

    w = L.build_layer_weights(7)
    lazy = M._lazy_weights(L.HIDDEN, L.INTERMEDIATE, L.EXPERTS, True, 1000 + L.HIDDEN + L.INTERMEDIATE + L.EXPERTS)
    for name in ("w13_blocks", "w13_scales", "w2_blocks", "w2_scales"):
        assert isinstance(w[name], M.LazyExperts) and w[name]._recipe == lazy[name]._recipe, name
    resident = sum(t.nbytes for t in w.values() if not isinstance(t, M.LazyExperts))
    assert resident < 128 << 20, f"the layer's weights hold {resident >> 20} MiB"
    start, end = M.shard_columns(L.INTERMEDIATE, 8, 7)  # rank 7: the short block run (192 columns)
    shard = L.shard_layer_weights(w, 7)
    assert not any(isinstance(t, M.LazyExperts) for t in shard.values())
    torch.save(shard, io.BytesIO())  # what harness/layer_ranks.save_shard does
    for e in (0, 77, L.EXPERTS - 1):  # one expert regenerated whole, sliced as the shard's
        assert torch.equal(shard["w13_blocks"][e], w["w13_blocks"][e][2 * start:2 * end])
        assert torch.equal(shard["w13_scales"][e], w["w13_scales"][e][2 * start:2 * end])
        assert torch.equal(shard["w2_blocks"][e], w["w2_blocks"][e][:, start // 2:end // 2])
        assert torch.equal(shard["w2_scales"][e], w["w2_scales"][e][:, start // 32:end // 32])
    assert torch.equal(shard["w13_bias"], w["w13_bias"][:, 2 * start:2 * end])


def test_routed_moe_runs_on_the_plain_moes_lazy_checkpoint_and_prepared_weights():
    """The routed MoE's builder (moe_routed_mxfp4_gptoss) holds the plain MoE builder's lazy checkpoint, the same
    tensor objects (not a second, eager ~1.7 GB copy beside it), so a package's `moe` and `routed` entries run on
    one set of prepared weights (prepared once)."""
    import references.moe as M
    from amd_kernels.moe.mxfp4_moe_entries import WEIGHTS
    from harness import discovery

    dims = {"hidden": 2880, "intermediate": 2880, "experts": 128, "top_k": 4, "tp_size": 8, "tp_rank": 7}
    plain = M.build_moe_inputs(2, dims, 1, activation="gptoss")
    routed = M.build_routed_moe_inputs(2, dims, 2)
    for name in ("w13_blocks", "w13_scales", "w2_blocks", "w2_scales"):
        assert isinstance(routed[name], M.LazyExperts) and routed[name] is plain[name], name
    pkg = discovery.discover()["moe/mxfp4_h2880_i384_e128_top4"]
    moe_in, routed_in = pkg.entry_inputs("moe", plain), pkg.entry_inputs("routed", routed)
    for name in WEIGHTS:
        assert routed_in[name] is moe_in[name], name


def test_released_caches_take_what_a_caught_error_kept():
    """A test that catches an error keeps the tensors of the frames the error passed through in a reference
    cycle (frame -> ExceptionInfo -> traceback -> frame); releasing the caches between shapes frees them."""
    import gc
    import weakref

    import torch

    def entry(weights):
        raise ValueError("w13: not prepared")

    def a_test():
        weights = torch.ones(1 << 20)
        with pytest.raises(ValueError) as err:
            entry(weights)
        assert "w13" in str(err.value)
        return weakref.ref(weights)

    enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between: the cycle must be what keeps it
    try:
        kept = a_test()
        assert kept() is not None  # the cycle holds it after the test returned
        memory.release_caches()
        assert kept() is None
    finally:
        if enabled:
            gc.enable()


def test_released_caches_drop_the_attention_workspaces():
    """Between shapes the harness drops the paged attention's split workspace (264 MiB, resident once an emulated
    run wrote it) through the package's release_workspaces(); the next call allocates it again."""
    import importlib
    import weakref

    import torch

    pkg = importlib.import_module("amd_kernels.attention.paged_q8_kv1_d64")
    part_o, part_ml = pkg._built.workspace(torch.device("cpu"), 1)  # views of the one workspace
    held = weakref.ref(part_o._base)
    del part_o, part_ml
    assert held() is not None  # the package keeps it between calls
    memory.release_caches()
    assert held() is None
    assert pkg._built.workspace(torch.device("cpu"), 1)[0].shape[0] == 1
    pkg.release_workspaces()


def test_only_a_dropped_cache_walks_the_frozen_objects():
    """With nothing cached, releasing the caches collects only what was made since the last freeze (walking
    the frozen objects too cost ~5 s a test late in a suite run); when a cache held something (the next test
    takes another shape), the frozen objects are walked as well, so a cycle an earlier test left frozen goes."""
    import gc
    import weakref

    from references import attention as ref_attention

    class Node:
        pass

    rope = {"theta": 10000.0, "factor": 1.0, "original_max_position_embeddings": 8, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": False}
    enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between
    try:
        memory.release_caches()
        node = Node()
        node.me = node
        kept = weakref.ref(node)
        gc.freeze()  # as settle() leaves what a test kept
        del node
        memory.release_caches()
        assert kept() is not None  # nothing was cached: the frozen cycle was not walked
        ref_attention._cos_sin_cache(8, 8, tuple(sorted(rope.items())))
        assert memory.release_caches()  # a cache held something
        assert kept() is None
    finally:
        if enabled:
            gc.enable()
