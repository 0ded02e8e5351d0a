"""Find kernel packages by their plain-data declaration, kernels/<category>/<shape token>/kernel.toml.

The declaration names the package's entries, the reference op each implements (and, when the entry takes
prepared weights, the package function that prepares them from the reference's inputs), and how its
workgroups split the output (so the emulator may run a sample of them on large shapes). Discovery
reads only the TOML; the package is imported when a case needs its entries.
"""

from __future__ import annotations

import importlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from harness.toolchain import REPO

KERNELS_DIR = REPO / "kernels"


@dataclass(frozen=True)
class KernelPackage:
    path: str  # "<category>/<shape token>"
    module: str  # "amd_kernels.<category>.<shape token>"
    entries: dict  # entry name -> reference op name
    prepare: dict  # entry name -> name of the package function mapping reference inputs to entry inputs
    # how the emulator may sample large launches (harness/checks.py): "rows" (workgroup x computes a block
    # of token rows), "tiles" (workgroups store output tiles independently), "tokens" (the package's
    # emulator_workgroups() names the workgroups a sample of token rows needs), "" = no sampling
    workgroups: str
    emulator_token_counts: tuple  # token counts the emulator checks by default; () = every regime count
    readme: Path
    # sample only above this token count (kernel.toml `sample_above_tokens`; e.g. the MoE packages run
    # their small token counts whole); an op may set its own ([emulator.op_sample_above_tokens])
    sample_above_tokens: int = 0
    emulator_op_sample_above_tokens: dict = field(default_factory=dict)
    # `workgroups = "tokens"`: the token rows a sampled run computes (kernel.toml `sample_tokens`; 0 = the
    # harness's EMULATOR_SAMPLE_TOKENS)
    sample_tokens: int = 0
    # multi-GPU kernels: the harness runs their cases on this many ranks (harness/multirank.py)
    ranks: int = 1
    # op -> its own emulator token counts (kernel.toml [emulator.op_token_counts]), else emulator_token_counts
    emulator_op_token_counts: dict = field(default_factory=dict)
    # op -> the batch-invariance counts the emulator runs (kernel.toml [emulator.op_invariance_counts]), for
    # an op whose tiers are another op's, checked there at every edge; else the harness's list
    emulator_op_invariance_counts: dict = field(default_factory=dict)
    # where no list applies: every regime count up to this many tokens (kernel.toml [emulator]
    # token_counts_up_to; 0 = every count)
    emulator_up_to: int = 0

    def sample_above(self, op: str) -> int:
        """The token count above which the emulator samples `op`'s launches (its own, else the package's)."""
        return int(self.emulator_op_sample_above_tokens.get(op, self.sample_above_tokens))

    def emulator_counts_for(self, op: str) -> tuple:
        return tuple(self.emulator_op_token_counts.get(op, self.emulator_token_counts))

    def checked_by_default(self, op: str, tokens: int, emulated: bool) -> bool:
        """Does CI check `op` at `tokens` (and `harness run` without --all)? A GPU checks every count; the
        emulator the kernel.toml [emulator] set (the op's own list, else the package's list or bound), or
        every count where the package gives none."""
        if not emulated:
            return True
        subset = self.emulator_counts_for(op)
        if subset:
            return tokens in subset
        return not self.emulator_up_to or tokens <= self.emulator_up_to

    def import_entries(self) -> dict:
        mod = importlib.import_module(self.module)
        return {name: getattr(mod, name) for name in self.entries}

    def entry_inputs(self, entry: str, inputs: dict) -> dict:
        """Reference inputs -> the entry's (e.g. checkpoint weights -> prepared, preshuffled weights)."""
        name = self.prepare.get(entry)
        if not name:
            return inputs
        return getattr(importlib.import_module(self.module), name)(inputs)

    def entry_for_op(self, op: str) -> str:
        names = [n for n, o in self.entries.items() if o == op]
        if len(names) != 1:
            raise LookupError(f"{self.path}: {len(names)} entries implement op {op!r}")
        return names[0]


def discover() -> dict[str, KernelPackage]:
    packages = {}
    for decl in sorted(KERNELS_DIR.glob("*/*/kernel.toml")):
        data = tomllib.loads(decl.read_text())
        rel = decl.parent.relative_to(KERNELS_DIR).as_posix()
        if data.get("shape_token") != decl.parent.name or data.get("category") != decl.parent.parent.name:
            raise ValueError(f"{decl}: category/shape_token must match the folder {rel}")
        packages[rel] = KernelPackage(
            path=rel,
            module="amd_kernels." + rel.replace("/", "."),
            entries={name: spec["op"] for name, spec in data["entries"].items()},
            prepare={name: spec["prepare"] for name, spec in data["entries"].items() if "prepare" in spec},
            workgroups=data.get("workgroups", ""),
            emulator_token_counts=tuple(data.get("emulator", {}).get("token_counts", ())),
            sample_above_tokens=int(data.get("sample_above_tokens", 0)),
            sample_tokens=int(data.get("sample_tokens", 0)),
            readme=decl.parent / "README.md",
            ranks=int(data.get("ranks", 1)),
            emulator_op_token_counts={op: tuple(c) for op, c in
                                      data.get("emulator", {}).get("op_token_counts", {}).items()},
            emulator_op_invariance_counts={op: tuple(c) for op, c in
                                           data.get("emulator", {}).get("op_invariance_counts", {}).items()},
            emulator_up_to=int(data.get("emulator", {}).get("token_counts_up_to", 0)),
            emulator_op_sample_above_tokens={op: int(n) for op, n in
                                              data.get("emulator", {}).get("op_sample_above_tokens", {}).items()},
        )
    return packages
