"""Suite-wide test settings.

Tuning is off by default: most tests call conv() on many tiny shapes, and measuring
each would make the suite slow and the choice timing-dependent; the tuner's own
tests turn it on. The tuning cache goes to a private temporary directory so the
suite never touches the user's cache.
"""

import os
import tempfile

os.environ.setdefault("CONVENGINE_TUNING", "off")
os.environ.setdefault("CONVENGINE_CACHE_DIR", tempfile.mkdtemp(prefix="convengine-test-cache-"))
