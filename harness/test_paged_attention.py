"""What is special about the paged attention entries: the value checks of their arguments (run on CPU
tensors, i.e. under the emulator; on a GPU only with AMD_KERNELS_CHECK_VALUES=1) name the argument; tracing
the prefill kernel reads no freed memory."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from harness import checks
from harness import device as devices
from references import attention

DIMS = {"query_heads": 8, "kv_heads": 1, "sliding_window": 0, "context_lengths": [1, 65, 130, 1000]}


def _broken(inputs: dict):
    table, lens, cu = inputs["block_table"], inputs["seq_lens"], inputs["cu_seqlens_q"]
    bad = table.clone()
    bad[0, 0] = inputs["key_cache"].shape[0]  # a used entry past the cache
    yield "block_table", {**inputs, "block_table": bad}
    bad = lens.clone()
    bad[1] = table.shape[1] * 64 + 1  # more keys than the table holds
    yield "seq_lens", {**inputs, "seq_lens": bad}
    bad = cu.clone()
    bad[2] = bad[1] - 1  # decreasing
    yield "cu_seqlens_q", {**inputs, "cu_seqlens_q": bad}
    bad = lens.clone()
    bad[0] = 0  # one query row, no key
    yield "seq_lens", {**inputs, "seq_lens": bad}


@pytest.mark.skipif(not devices.current().emulated, reason="the value checks run on CPU tensors (emulator)")
def test_value_checks_name_the_argument():
    from amd_kernels.attention import paged_q8_kv1_d64 as package

    for build, entry in ((attention.build_paged_attention_inputs, package.paged_attention),
                         (attention.build_paged_attention_fp8_inputs, package.paged_attention_fp8)):
        inputs = checks.to_device(build(4, DIMS, 0), "cpu")
        for name, broken in _broken(inputs):
            with pytest.raises(ValueError, match=f"^{name}: "):
                entry(**broken)
        with pytest.raises(ValueError, match="^sliding_window: "):
            entry(**{**inputs, "sliding_window": 64})
    with pytest.raises(TypeError, match="^k_scale: "):
        package.paged_attention_fp8(**{**inputs, "k_scale": inputs["k_scale"].double()})
    with pytest.raises(TypeError, match="^key_cache: "):  # a bf16 cache handed to the fp8 tier
        package.paged_attention_fp8(**{**inputs, "key_cache": inputs["key_cache"].to(torch.bfloat16)})


def test_split_depends_only_on_the_length():
    """The host twin of the kernel's split rule: whole blocks, at most MAX_SPLITS, at least MIN_SPLIT_BLOCKS."""
    from amd_kernels.attention import paged_decode as kd

    for keys in (1, 64, 65, 512, 513, 1000, 8192, 32768, 131072):
        spb, n = kd.splits_of(keys, 32, 8)
        assert spb >= 8 and n <= 32 and (n - 1) * spb * 64 < keys <= n * spb * 64
    assert torch.tensor([kd.splits_of(131072, 32, 8)[1], kd.splits_of(8192, 32, 8)[1]]).tolist() == [32, 16]


@pytest.mark.skipif(not devices.current().emulated, reason="runs the kernels in the emulator")
def test_partials_workspace_is_reused_and_chunks_keep_the_bits():
    """The split partials live in one workspace per device (a stable pointer for graph capture); a batch above
    its size runs in chunks of sequences with the same output bits as one launch."""
    from amd_kernels.attention import paged_entries
    from amd_kernels.attention import paged_q8_kv1_d64 as package
    from amd_kernels.attention import paged_q8_kv1_d64 as kernel  # its shape constants

    small = paged_entries.build(package.__name__, "paged_q8_kv1_d64_chunk_test", kernel.KV_HEADS, kernel.MAX_SPLITS,
                                kernel.MIN_SPLIT_BLOCKS,
                                paged_entries.variants(kernel.KV_HEADS, kernel.MAX_SPLITS, kernel.MIN_SPLIT_BLOCKS),
                                workspace_sequences=2)
    inputs = checks.to_device(attention.build_paged_attention_inputs(5, DIMS, 1), "cpu")  # 1000 keys: 2 splits
    whole = package.paged_attention(**inputs)
    chunked = small.paged_attention(**inputs)
    assert torch.equal(whole, chunked)
    first = small.workspace(inputs["q"].device, 2)[0].data_ptr()
    small.paged_attention(**inputs)
    assert small.workspace(inputs["q"].device, 1)[0].data_ptr() == first
    assert small.workspace_bytes == 2 * 1 * kernel.MAX_SPLITS * 8 * (64 + 2) * 4


# The prefill tier's CI subset, run whole on the emulator (every workgroup; the regime's prefill counts run
# sampled and only with AMD_KERNELS_FULL=1): one mixed batch at TP8 with the lengths around the 32-row Q tile
# and the 64-key block, decode sequences between prefill ones, cached prefixes up to 1000 keys.
PREFILL_Q_LENS = [1, 63, 65, 2, 129, 1, 127]
PREFILL_SEQ_LENS = [1000, 63, 64 + 65, 2, 1000 + 129, 70, 64 + 127]


@pytest.mark.parametrize("window", [0, 128])
def test_prefill_tier_whole_batch(window):
    """Every sequence of a mixed prefill / decode batch matches the reference (both tiers, every Q tile); a
    prefill and a decode sequence give the same bits alone; two runs give the same bits."""
    from amd_kernels.attention import paged_q8_kv1_d64 as package

    dims = {"query_heads": 8, "kv_heads": 1, "sliding_window": window}
    inputs = attention.build_paged_attention_inputs(sum(PREFILL_Q_LENS), dims, 7, seq_lens=PREFILL_SEQ_LENS,
                                                    q_lens=PREFILL_Q_LENS)
    dev = devices.current().torch_device
    out = package.paged_attention(**checks.to_device(inputs, dev)).cpu()
    ref = attention.paged_attention(**inputs)[0]
    cu = inputs["cu_seqlens_q"].tolist()
    for b in range(len(PREFILL_Q_LENS)):
        got, want = out[cu[b]:cu[b + 1]].float().flatten(), ref[cu[b]:cu[b + 1]].float().flatten()
        cos = float(torch.nn.functional.cosine_similarity(got, want, dim=0))
        assert cos >= attention.PAGED_COSINE_MIN, (b, PREFILL_Q_LENS[b], PREFILL_SEQ_LENS[b], cos)
    assert torch.equal(package.paged_attention(**checks.to_device(inputs, dev)).cpu().view(torch.int16),
                       out.view(torch.int16))
    for b in (4, 5):  # a prefill sequence (129 rows, 1000 cached keys) and a decode one, alone
        sub, rows = attention.sub_batch_paged_attention(inputs, list(range(cu[b], cu[b + 1])))
        alone = package.paged_attention(**checks.to_device(sub, dev)).cpu()
        assert torch.equal(alone.view(torch.int16), out[rows].view(torch.int16)), b


def test_prefill_tiles_and_tiers():
    """The host twins of the prefill grid: a sequence's Q tiles depend on its own length only."""
    from amd_kernels.attention import paged_prefill as kp

    assert [kp.tiles_of(n) for n in (0, 1, 2, 32, 33, 63, 64, 65, 8192)] == [0, 0, 1, 1, 2, 2, 2, 3, 256]
    assert kp.chunks_of(0) == 0 and kp.chunks_of(33) == 2 and kp.chunks_of(8192) == 256


@pytest.mark.parametrize("seed", range(6))
def test_prefill_workgroups_cover_every_tile_once(seed):
    """The host twin of the prefill grid (batch + chunks workgroups): every Q tile of every sequence has exactly
    one workgroup, workgroup_of inverts it, and about one workgroup a sequence idles."""
    from amd_kernels.attention import paged_prefill as kp

    gen = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, 40, (1,), generator=gen))
    q_lens = [int(v) for v in torch.randint(0, 4, (B,), generator=gen)]  # many short (0, 1, 2, 3 rows) ...
    for b in torch.randint(0, B, (B // 3 + 1,), generator=gen).tolist():
        q_lens[b] = int(torch.randint(1, 300, (1,), generator=gen))  # ... some long
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    pad = int(torch.randint(0, 70, (1,), generator=gen))  # graph-padding rows past cu[-1]
    chunks = kp.chunks_of(cu[-1] + pad)
    got = [kp.tile_of_workgroup(x, cu, chunks) for x in range(B + chunks)]
    tiles = [t for t in got if t is not None]
    want = [(b, t) for b in range(B) for t in range(kp.tiles_of(q_lens[b]))]
    assert sorted(tiles) == want
    assert all(got[kp.workgroup_of(b, t, cu, B + chunks)] == (b, t) for b, t in want)
    # idle: the x < B of sequences without tiles, and chunks holding only last tiles' rows, rows of q_len <= 1
    # sequences and padding rows
    assert len(got) - len(tiles) <= B + 1 + (sum(n for n in q_lens if n <= 1) + pad) // kp.TILE_TOKENS


_TRACE_PREFILL = """
import faulthandler
faulthandler.enable()
import flydsl.compiler as flyc
from amd_kernels.attention import paged_q8_kv1_d64 as package
for key in ("prefill_full", "prefill_window"):
    variant = package.VARIANTS.variants[key]
    try:
        flyc.compile(variant.launcher, *variant.example_args())
    except RuntimeError as err:  # the trace ran; the artifact lookup in the empty cache missed
        if "RUN_ONLY" not in str(err):
            raise
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the malloc settings are glibc's")
def test_prefill_trace_reads_no_freed_memory(tmp_path):
    """Tracing the prefill kernels reads no freed memory. With glibc's per-thread cache off, MALLOC_PERTURB_
    fills freed blocks with 0xa5, so reading an erased MLIR value (as FlyDSL 0.5's ternary dispatcher does,
    which paged_prefill._if avoids) fails on the first trace instead of in one suite run out of a few."""
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.tcache_count=0", MALLOC_PERTURB_="165",
               FLYDSL_RUNTIME_RUN_ONLY="1", FLYDSL_RUNTIME_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", _TRACE_PREFILL], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
