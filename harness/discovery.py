"""Find kernel packages by their plain-data declaration, kernels/<category>/<shape token>/kernel.toml.

The declaration names the package's entries and the reference op each implements, and how its
workgroups split the output (so the emulator may run a sample of them on large shapes). Discovery
reads only the TOML; the package is imported when a case needs its entries.
"""

from __future__ import annotations

import importlib
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.toolchain import REPO

KERNELS_DIR = REPO / "kernels"


@dataclass(frozen=True)
class KernelPackage:
    path: str  # "<category>/<shape token>"
    module: str  # "amd_kernels.<category>.<shape token>"
    entries: dict  # entry name -> reference op name
    workgroups: str  # "rows": workgroup x computes a contiguous block of token rows; "" = no sampling
    readme: Path

    def import_entries(self) -> dict:
        mod = importlib.import_module(self.module)
        return {name: getattr(mod, name) for name in self.entries}

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
            workgroups=data.get("workgroups", ""),
            readme=decl.parent / "README.md",
        )
    return packages
