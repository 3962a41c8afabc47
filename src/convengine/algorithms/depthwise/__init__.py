"""The depthwise family: per-channel convolution kernels, vectorised over channels.

- ``forward``: the generated forward kernels (span and edge kernels per tap count, the
  register-blocked FMA block), used by the ``direct`` algorithm for depthwise problems.
- ``data``: backward-data.
- ``weight``: backward-weight.
- ``reference``: numpy, exactly what the kernels compute (for the tests).
"""

from . import data, forward, weight  # noqa: F401
