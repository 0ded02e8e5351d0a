#!/usr/bin/env bash
# amd_kernels environment.
#   source env.sh              this checkout on PYTHONPATH (as amd_kernels), JIT caches in .cache/, and,
#                              with no ROCm present, FlyDSL compiling for gfx950 through the system ld.lld-22
#   ./env.sh [--setup] CMD...  the same for one command; --setup first installs what is missing on a fresh
#                              machine (test extras, flydsl, torch 2.13.0 CPU only when no torch, lld-22/llvm-22
#                              only when no ROCm toolchain). It never replaces an installed torch or flydsl.

_amdk_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

_amdk_setup() {
  local py=python3 missing=()
  $py -c "import torch" 2>/dev/null || $py -m pip install -q torch==2.13.0 || return 1
  for mod in pytest xdist hypothesis numpy msgpack tqdm matplotlib; do
    $py -c "import $mod" 2>/dev/null || missing+=("$mod")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    $py -m pip install -q pytest pytest-xdist hypothesis numpy msgpack tqdm matplotlib || return 1
  fi
  $py - <<'PY' 2>/dev/null || $py -m pip install -q "flydsl>=0.5" || return 1
import importlib.metadata as m
v = tuple(int(x) for x in m.version("flydsl").split(".")[:2])
raise SystemExit(0 if v >= (0, 5) else 1)
PY
  local rocm_lld="${ROCM_PATH:-/opt/rocm}/llvm/bin/ld.lld"
  if ! command -v llvm-objdump-22 >/dev/null || { [ ! -x "$rocm_lld" ] && ! command -v ld.lld-22 >/dev/null; }; then
    # the linker for code objects, and llvm-objdump/llvm-mc for the emulator (llvm-19 does not know gfx950)
    apt-get update -qq && apt-get install -y -qq --no-install-recommends lld-22 llvm-22 >/dev/null || return 1
  fi
}

if [ "${1:-}" = "--setup" ]; then
  shift
  _amdk_setup || { echo "env.sh: set-up failed" >&2; exit 1; }
fi

eval "$(cd "$_amdk_root" && python3 -m harness.importer)" || return 1 2>/dev/null || exit 1
export PYTHONPATH="$_amdk_root:$AMD_KERNELS_IMPORT_DIR${PYTHONPATH:+:$PYTHONPATH}"

if [ "${BASH_SOURCE[0]}" = "$0" ] && [ $# -gt 0 ]; then
  cd "$_amdk_root" && exec "$@"
fi
