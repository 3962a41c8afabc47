"""The blocked family: float GEMM micro-kernels over channels-last panels.

- ``forward``: the register-blocked micro-kernel (MR pixels x NR output channels of
  FMA accumulators, vector width from the ISA level) and its drivers: forward and
  backward-data as a forward conv over flipped weights.
- ``strided``: the space-to-depth rewrite of strided convolutions for it.
- ``narrow``: strided backward-data with few input channels (the stems): dy's rows
  times the weights by the Winograd GEMM micro-kernel, added into dx from the tile.
- ``weight``: backward-weight as a GEMM over the same panels.
- ``rows_template``, ``gather_template``, ``weight_template``: the drivers around the
  micro-kernels, one compiled module per tile shape (``convengine._kernel_cache``).
- ``reference``: numpy, exactly what one micro-kernel call computes (for the tests).

Importing the package registers the ``blocked`` algorithms.
"""

from . import forward, strided, weight  # noqa: F401  (registers the algorithms)
