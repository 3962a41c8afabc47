"""Test-wide settings: no autotuning by default (tests that tune opt in), no shipped
kernels, and a private cache directory so that no test touches the user's cache (compiled kernels
go to one kept across runs).

Under pytest-xdist each worker gets its own tuning cache (a worker inherits the
controller's environment, so the directory made there is replaced); the kernel
directory is shared, its files written whole and renamed into place.
"""

import os
import tempfile

_PRIVATE = "_CONVENGINE_TEST_CACHE_DIR"  # the directory this file made, not the user's

os.environ.setdefault("CONVENGINE_TUNING", "off")
# kernels compiled for the host, also in a checkout where `convengine build-cache` put
# shipped kernels (tests/test_shipped.py sets its own)
os.environ.setdefault("CONVENGINE_SHIPPED", "0")
if ("CONVENGINE_CACHE_DIR" not in os.environ
        or os.environ["CONVENGINE_CACHE_DIR"] == os.environ.get(_PRIVATE)):
    _worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    os.environ[_PRIVATE] = os.environ["CONVENGINE_CACHE_DIR"] = tempfile.mkdtemp(
        prefix=f"convengine-test-cache-{_worker}")
# compiled kernels are kept across runs (their names cover what changes their code)
os.environ.setdefault("CONVENGINE_KERNEL_DIR", os.path.join(
    tempfile.gettempdir(), f"convengine-test-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"))


def pytest_addoption(parser):  # noqa: ANN001, ANN201
    parser.addoption(
        "--every", type=int, default=1, metavar="N",
        help="run only every Nth collected test, by position (1: all); CI's checked-mode "
             "tier samples the kernel families' variants this way")


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201
    every = config.getoption("--every")
    if every < 1:
        raise ValueError(f"--every must be a positive integer, got {every}")
    if every > 1:
        config.hook.pytest_deselected(items=[t for k, t in enumerate(items) if k % every])
        items[:] = items[::every]
