"""Run a test in a pytest process of its own, for tests that leave process-wide state behind (LLVM options
set by a compile, kernels/llvm_state.py) which would change what later tests in the worker compile."""

from __future__ import annotations

import os
import subprocess
import sys

ENV = "AMD_KERNELS_TEST_OWN_PROCESS"


def runs_here(request) -> bool:
    """True in the test's own process; elsewhere runs the test there, fails unless it passed, returns False."""
    if os.environ.get(ENV):
        return True
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           request.node.nodeid], env={**os.environ, ENV: "1"},
                          cwd=request.config.rootpath, capture_output=True, text=True)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
    return False
