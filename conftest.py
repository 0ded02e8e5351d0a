"""Wire the harness into pytest: pick the device before FlyDSL's runtime loads; compiles after a
warm-up are errors, not warnings."""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent
sys.path[:0] = [str(REPO)]


def pytest_configure(config):
    os.environ["AMD_KERNELS_COMPILE_ERROR"] = "1"
    from harness import importer

    importer.expose_amd_kernels()
    from harness import device

    dev = device.setup()
    config._amd_kernels_device = dev
    from harness import memory

    memory.return_freed_memory()


def pytest_collection_finish(session):
    import gc

    gc.collect()
    gc.freeze()  # the modules and collected items: harness.memory.settle() then walks only what tests add


def pytest_report_header(config):
    dev = getattr(config, "_amd_kernels_device", None)
    return f"amd_kernels device: {dev.kind if dev else 'not set up'}"


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_serving_session():
    """Each test starts before any warm-up, as a fresh server does: whether a first call is reported as a
    lazy warm-up must not depend on which tests ran earlier in the same worker."""
    from amd_kernels import compile_watch

    compile_watch.disarm()
    yield


# ---- memory: a per-test peak RSS limit, and cached inputs released between tests (harness/memory.py) ------
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    from harness import memory

    # Without a reset (not allowed here) VmHWM is the process's peak: only the test that crosses fails.
    item._amd_kernels_peak_start = 0 if memory.reset_peak() else memory.status_kib("VmHWM")
    item._amd_kernels_clock = memory.clock()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    item._amd_kernels_ran = True  # the test body ran (conftest's memory check applies to it)
    return (yield)


def _shares_inputs(item, nextitem) -> bool:
    """Does the next test take the same op shape (test_kernels' `shape` parameter), or another op of the same
    package at the same dims (a MoE package's `moe` and `routed`: one cached checkpoint, one set of prepared
    weights)? Then the cached inputs stay for it."""
    shape = getattr(getattr(item, "callspec", None), "params", {}).get("shape")
    other = getattr(getattr(nextitem, "callspec", None), "params", {}).get("shape")
    if shape is None or other is None:
        return False
    same_package_dims = (getattr(shape, "kernel", None), getattr(shape, "dims_json", None)) == (
        getattr(other, "kernel", 0), getattr(other, "dims_json", 0))
    return shape is other or same_package_dims


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    from harness import memory

    result = yield  # the test's fixtures are torn down first: what they hold counts in its peak
    peak = memory.status_kib("VmHWM")
    if nextitem is None or not _shares_inputs(item, nextitem):
        memory.release_caches()
    else:
        memory.settle()
    if getattr(item, "_amd_kernels_ran", False):
        memory.log_peak(item.nodeid, peak, getattr(item, "_amd_kernels_clock", None))
    limit = memory.limit_mib()
    # Only a test that ran: a skipped one allocated nothing, and its "peak" is what earlier tests left resident
    # (the shape's cached weights, kept for the next test of the shape), which their own checks counted.
    start = getattr(item, "_amd_kernels_peak_start", None)
    ran = getattr(item, "_amd_kernels_ran", False)
    if limit and ran and start is not None and peak > limit * 1024 >= start:
        pytest.fail(f"{item.nodeid}: this test process (pid {os.getpid()}) reached a peak RSS of {peak // 1024} "
                    f"MiB, above the limit of {limit} MiB ({memory.LIMIT_ENV}=0 turns the check off)", pytrace=False)
    return result
