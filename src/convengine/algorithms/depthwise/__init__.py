"""The depthwise family: per-channel convolution kernels, vectorised over channels.

- ``forward``: the forward kernels (the register-blocked FMA block, the span and edge
  row kernels generated per kernel width), used by the ``direct`` algorithm for
  depthwise problems; ``forward_template``: their tasks, one compiled module per
  kernel shape (``convengine._kernel_cache``).
- ``data``: backward-data.
- ``weight``: backward-weight; ``weight_template``: its tasks per kernel shape.
- ``reference``: numpy, exactly what the kernels compute (for the tests).
"""

from . import data, forward, weight  # noqa: F401
