"""Make `import amd_kernels` work from a plain checkout (the package's folder is kernels/).

`pip install -e .` maps the name itself; without it, a symlink .cache/import/amd_kernels -> kernels on
sys.path does (env.sh puts the same folder on PYTHONPATH).
"""

from __future__ import annotations

import importlib.util
import os
import sys

from harness.toolchain import CACHE, REPO, configure_gfx950

IMPORT_DIR = CACHE / "import"


def ensure_link() -> None:
    link = IMPORT_DIR / "amd_kernels"
    target = REPO / "kernels"
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    IMPORT_DIR.mkdir(parents=True, exist_ok=True)
    tmp = IMPORT_DIR / f".amd_kernels.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(target)
    tmp.replace(link)


def expose_amd_kernels() -> None:
    if importlib.util.find_spec("amd_kernels") is not None:
        return
    ensure_link()
    sys.path.insert(0, str(IMPORT_DIR))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(IMPORT_DIR), os.environ.get("PYTHONPATH")]))


def shell_exports() -> str:
    """`export` lines for env.sh: the gfx950 set-up (harness.toolchain), the checkout's import paths."""
    import shlex

    configure_gfx950()
    ensure_link()
    names = ("ARCH", "FLYDSL_GPU_ARCH", "ROCM_PATH", "FLYDSL_RUNTIME_CACHE_DIR")
    return "\n".join(f"export {n}={shlex.quote(os.environ[n])}" for n in names) + (
        f"\nexport AMD_KERNELS_IMPORT_DIR={shlex.quote(str(IMPORT_DIR))}"
    )


if __name__ == "__main__":
    print(shell_exports())
