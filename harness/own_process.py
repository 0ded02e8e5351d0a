"""Run a test in a pytest process of its own, for tests that leave process-wide state behind (LLVM options
set by a compile, kernels/llvm_state.py) which would change what later tests in the worker compile."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ENV = "AMD_KERNELS_TEST_OWN_PROCESS"
TIMEOUT_S = 1800  # the longest of these tests takes under a minute on CI's 2 cores


def runs_here(request) -> bool:
    """True in the test's own process; elsewhere runs the test there, fails unless it passed, returns False."""
    if os.environ.get(ENV):
        return True
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:xdist", "-p", "no:cacheprovider",
                           request.node.nodeid], env={**os.environ, ENV: "1"},
                          cwd=request.config.rootpath, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode == 0 and "1 skipped" in done.stdout:  # said as a skip here too, with its reason
        pytest.skip("in its own process: " + done.stdout.strip().splitlines()[-2][-300:])
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
    return False
