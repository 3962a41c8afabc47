"""The inference epilogue of a conv in one parallel pass over its output, in place:

    y = act(y + bias [+ residual])        y, residual (rows, O) float32, bias (O,)

with act one of ``ACTIVATIONS`` (codes :class:`~convengine.epilogue_codes.Activation`).
PyTorch eager runs BatchNorm (here folded into the conv's weights and ``bias``), the
residual add and the activation as separate passes over memory; this is one, on
convengine's threads. NaN propagates as in PyTorch (``relu(NaN)`` is NaN).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ._kernel_cache import kernel
from .epilogue_codes import FUSED, Activation, names

ACTIVATIONS = names(FUSED)
_RELU, _RELU6, _SILU = int(Activation.RELU), int(Activation.RELU6), int(Activation.SILU)


@kernel(parallel=True, nogil=True)
def _epilogue(y, bias, residual, has_residual, act):  # pragma: no cover - compiled
    rows, cols = y.shape
    for r in prange(rows):
        for c in range(cols):
            v = y[r, c] + bias[c]
            if has_residual:
                v += residual[r, c]
            if act == _RELU:
                if v < 0:
                    v = 0.0
            elif act == _RELU6:
                if v < 0:
                    v = 0.0
                elif v > 6:
                    v = 6.0
            elif act == _SILU:
                v = v / (1.0 + np.exp(-v))
            y[r, c] = v


def apply(y: np.ndarray, bias: np.ndarray, residual: np.ndarray | None, activation: str) -> None:
    """In place: ``y (rows, O) = act(y + bias (O,) [+ residual (rows, O)])``, float32,
    ``y`` C-contiguous (a channels-last conv output viewed as rows)."""
    code = Activation.of(activation, FUSED)
    if y.ndim != 2 or not y.flags.c_contiguous or y.dtype != np.float32:
        raise ValueError(f"y must be a C-contiguous 2-D float32 array, got {y.dtype} "
                         f"of shape {y.shape}")
    if bias.shape != (y.shape[1],):
        raise ValueError(f"bias must have shape ({y.shape[1]},), got {bias.shape}")
    if residual is not None and residual.shape != y.shape:
        raise ValueError(f"residual must have y's shape {y.shape}, got {residual.shape}")
    res = y if residual is None else residual.astype(np.float32, copy=False)
    _epilogue(y, bias.astype(np.float32, copy=False), res, residual is not None,
              int(code))
