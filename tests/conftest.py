"""Test-wide settings: no autotuning by default (tests that tune opt in), and a
private cache directory so that no test touches the user's cache (compiled kernels
go to one kept across runs).

Under pytest-xdist each worker gets its own tuning cache (a worker inherits the
controller's environment, so the directory made there is replaced); the kernel
directory is shared, its files written whole and renamed into place.
"""

import os
import tempfile

_PRIVATE = "_CONVENGINE_TEST_CACHE_DIR"  # the directory this file made, not the user's

os.environ.setdefault("CONVENGINE_TUNING", "off")
if ("CONVENGINE_CACHE_DIR" not in os.environ
        or os.environ["CONVENGINE_CACHE_DIR"] == os.environ.get(_PRIVATE)):
    _worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    os.environ[_PRIVATE] = os.environ["CONVENGINE_CACHE_DIR"] = tempfile.mkdtemp(
        prefix=f"convengine-test-cache-{_worker}")
# compiled kernels are kept across runs (their names cover what changes their code)
os.environ.setdefault("CONVENGINE_KERNEL_DIR", os.path.join(
    tempfile.gettempdir(), f"convengine-test-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"))
