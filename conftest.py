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
