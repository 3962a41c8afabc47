"""``1x1``: a 1x1, stride-1, unpadded, dense conv in channels-last is one GEMM.

x ``(N, *S, C)`` viewed as ``(N*prod(S), C)`` without a copy; w ``(O, C)``. The
GEMMs go through :func:`convengine.threads.matmul` (rows over convengine's threads).
"""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem
from ..registry import register
from ..threads import matmul


def _supports(problem: ConvProblem) -> str | None:
    if not problem.is_pointwise:
        return (
            f"needs a 1x1 kernel, stride 1 and no padding (kernel {problem.kernel}, "
            f"stride {problem.stride}, padding {problem.padding})"
        )
    if problem.groups != 1:
        return f"groups={problem.groups} != 1"
    return None


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


@register("1x1", "forward", supports=_supports)
def pointwise_fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return matmul(_rows(x), _rows(w).T).reshape(problem.y_shape("NHWC"))


@register("1x1", "backward_data", supports=_supports)
def pointwise_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    return matmul(_rows(dy), _rows(w)).reshape(problem.x_shape("NHWC"))


@register("1x1", "backward_weight", supports=_supports)
def pointwise_bwd_weight(problem: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return matmul(_rows(dy).T, _rows(x)).reshape(problem.w_shape("NHWC"))
