"""What the emulator CI checks of the paged attention at each decode count it checks (kernel.toml): which
sequences (context lengths) the sampled numerics and sequence-invariance cases run, and with how many KV heads,
then a summary table per package, op and layer. No kernel runs; it replays the harness's seeds.

    ./env.sh python3 -m benchmarks.attention.ci_coverage

Every paged-attention case runs sampled (kernel.toml workgroups = "tokens", sample_above_tokens = 0):
harness/checks.py draws sample_tokens(package) query rows of the real ones, and the package's
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
    summary = []
    for shape in cases.op_shapes():
        decode = [c for c in shape.token_counts if c.phase == "decode"]
        if not shape.op.startswith("paged_attention") or not decode:
            continue  # (the prefill shapes' CI counts are in kernel.toml; their sequences come from prefill_batch_of)
        pkg = packages[shape.kernel]
        ci = [c for c in decode if pkg.checked_by_default(shape.op, c.tokens, True)]
        layer = "window" if shape.dims.get("sliding_window") else "full"
        print(f"{shape.id} ({layer}), CI decode counts {[c.tokens for c in ci]}:")
        hkv = int(shape.dims["kv_heads"])
        tally = dict(cases=0, whole=0, one_head=0, above_32k=0)
        for count in ci:
            for check, seed, salt in (("numerics", checks.seed_of(shape.id, count.tokens, count.real), "tokens"),
                                      ("invariance", checks.seed_of("invariance", shape.id, count.tokens, count.real),
                                       "invariance")):
                lens = attention.context_lengths_of(count.tokens, shape.dims, seed)[:count.real]
                rows = sorted(random.Random(checks.seed_of(salt, seed)).sample(
                    range(count.real), min(count.real, checks.sample_tokens(pkg))))
                cut = [lens[r] > paged_entries.EMULATOR_ALL_HEADS_KEYS and hkv > 1 for r in rows]
                picked = [f"{lens[r]}{f' (1 of {hkv} KV heads)' if c else ''}" for r, c in zip(rows, cut)]
                whole = len(rows) == count.real and not any(cut)
                tally["cases"] += 1
                tally["whole"] += whole
                tally["one_head"] += any(cut)
                tally["above_32k"] += any(lens[r] > 32768 for r in rows)
                print(f"  {count.tokens:4d} rows ({count.real} real) {check:10s}: {'whole' if whole else 'sampled'}, "
                      f"sequences of {', '.join(picked)} keys")
        summary.append((f"{shape.kernel.split('/')[-1]} `{shape.op}` ({layer})", len(ci), tally))
    print("\n| package, op (layer) | CI decode counts | cases | whole | a sequence in 1 KV head | a sequence above "
          "32768 keys |")
    print("|---|---|---|---|---|---|")
    for name, n, t in summary:
        print(f"| {name} | {n} | {t['cases']} | {t['whole']} | {t['one_head']} | {t['above_32k']} |")


if __name__ == "__main__":
    main()
