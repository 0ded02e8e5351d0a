"""What the emulator CI checks of the paged attention at each token count: which sequences (context lengths)
the sampled numerics cases run, and with how many KV heads. No kernel runs; it replays the harness's seeds.

    ./env.sh python3 -m benchmarks.attention.ci_coverage

Every paged-attention case runs sampled (kernel.toml workgroups = "tokens", sample_above_tokens = 0):
harness/checks.py draws EMULATOR_SAMPLE_TOKENS query rows of the real ones, and the package's
emulator_workgroups() runs every split of those rows' sequences, in every KV head up to
EMULATOR_ALL_HEADS_KEYS keys and in one KV head above; only the output bytes those workgroups store are
compared. A count is whole when every real sequence is sampled and none is above that length.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    from harness import cases, checks, discovery, importer

    importer.expose_amd_kernels()
    from amd_kernels.attention import paged_entries
    from references import attention

    packages = discovery.discover()
    for shape in cases.op_shapes():
        if not shape.op.startswith("paged_attention"):
            continue
        subset = packages[shape.kernel].emulator_counts_for(shape.op)
        layer = "window" if shape.dims.get("sliding_window") else "full"
        print(f"{shape.id} ({layer}), CI counts {list(subset)}:")
        for count in shape.token_counts:
            if count.tokens not in subset:
                continue
            hkv = int(shape.dims["kv_heads"])
            for check, seed, salt in (("numerics", checks.seed_of(shape.id, count.tokens, count.real), "tokens"),
                                      ("invariance", checks.seed_of("invariance", shape.id, count.tokens, count.real),
                                       "invariance")):
                lens = attention.context_lengths_of(count.tokens, shape.dims, seed)[:count.real]
                rows = sorted(random.Random(checks.seed_of(salt, seed)).sample(
                    range(count.real), min(count.real, checks.EMULATOR_SAMPLE_TOKENS)))
                cut = [lens[r] > paged_entries.EMULATOR_ALL_HEADS_KEYS and hkv > 1 for r in rows]
                picked = [f"{lens[r]}{f' (1 of {hkv} KV heads)' if c else ''}" for r, c in zip(rows, cut)]
                whole = len(rows) == count.real and not any(cut)
                print(f"  {count.tokens:4d} rows ({count.real} real) {check:10s}: {'whole' if whole else 'sampled'}, "
                      f"sequences of {', '.join(picked)} keys")

if __name__ == "__main__":
    main()
