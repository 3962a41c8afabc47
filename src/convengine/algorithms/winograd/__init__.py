"""The Winograd family: F(m, 3) transforms, a batched GEMM in the transformed domain
(the 6 x NR FMA micro-kernel of ``algorithms.fma``), and the inverse transform.

- ``kernels``: the algorithm (forward, and backward-data as a forward conv), the
  weight transform and the generated scalar tails of the transforms.
- ``fused_template``: the fused kernel, one compiled module per (dims, m, dtype)
  (``convengine._kernel_cache``).
- ``reference``: numpy, exactly what the transforms compute (for the tests).

Importing the package registers the ``winograd`` algorithm.
"""

from . import kernels  # noqa: F401  (registers the algorithm)
