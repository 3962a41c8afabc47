"""Test-wide settings: no autotuning by default (tests that tune opt in), and a
private cache directory so that no test touches the user's cache."""

import os
import tempfile

os.environ.setdefault("CONVENGINE_TUNING", "off")
os.environ.setdefault("CONVENGINE_CACHE_DIR", tempfile.mkdtemp(prefix="convengine-test-cache-"))
