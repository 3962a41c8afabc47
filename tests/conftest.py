"""Test-wide settings: no autotuning by default (tests that tune opt in), and a
private cache directory so that no test touches the user's cache (compiled kernels
go to one kept across runs)."""

import os
import tempfile

os.environ.setdefault("CONVENGINE_TUNING", "off")
os.environ.setdefault("CONVENGINE_CACHE_DIR", tempfile.mkdtemp(prefix="convengine-test-cache-"))
# compiled kernels are kept across runs (their names cover what changes their code)
os.environ.setdefault("CONVENGINE_KERNEL_DIR", os.path.join(
    tempfile.gettempdir(), f"convengine-test-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"))
