"""The NaN rule: NaN and infinity give the same outputs whatever algorithm runs.

Each pass computes the sum its definition writes down, in IEEE arithmetic, as the
float64 ``reference`` does: forward and backward-weight sum over the zero-padded
input, so a padded tap adds ``0 * w`` (forward) or ``0 * dy`` (backward-weight),
which is NaN where that value is NaN or infinite; backward-data (and so the
transposed conv) sums ``dy * w`` over the pairs that land inside x, with no padded
terms. The fast algorithms agree with it on finite operands but not always on
non-finite ones: some skip padded taps (``direct``, Winograd), some multiply dy's zero
extension by w (backward-data through the transpose rule). So a call whose operands
could tell them apart runs the reference instead:

- forward, padded: w holds a NaN or an infinity (w is small: a quick check);
- backward-data, not 1x1: w holds one;
- backward-weight, padded: the result holds one (then dy or x did), or, where some
  output position has no tap inside x at all, dy holds one.
"""

from __future__ import annotations

import numpy as np

from . import registry
from .algorithms._finite import nonfinite
from .problem import ConvProblem
from .registry import Algorithm


def _padded(problem: ConvProblem) -> bool:
    return any(p != (0, 0) for p in problem.padding)


def _blind_outputs(problem: ConvProblem) -> bool:
    """Whether some output position may have no tap inside x in some dim: the padding
    reaches a whole dilated kernel, or the dilation steps over all of x."""
    return any(
        max(lo, hi) >= extent or d > n
        for (lo, hi), extent, d, n in zip(problem.padding, problem.effective_kernel,
                                          problem.dilation, problem.in_size)
    )


def reference_before(problem: ConvProblem, algorithm: Algorithm, b: np.ndarray) -> bool:
    """Whether a call must run the reference rather than ``algorithm``, given its second
    operand ``b`` (w for forward and backward-data, dy for backward-weight)."""
    if algorithm.name == "reference":
        return False
    if problem.pass_ == "forward":
        return _padded(problem) and bool(nonfinite(b))
    if problem.pass_ == "backward_data":
        return not problem.is_pointwise and bool(nonfinite(b))
    return _padded(problem) and _blind_outputs(problem) and bool(nonfinite(b))


def reference_after(problem: ConvProblem, algorithm: Algorithm, out: np.ndarray) -> bool:
    """Whether a backward-weight result ``out`` of ``algorithm`` must be recomputed by the
    reference: padded, and non-finite (dy or x held a NaN or an infinity)."""
    return (problem.pass_ == "backward_weight" and algorithm.name != "reference"
            and _padded(problem) and bool(nonfinite(out)))


def reference(problem: ConvProblem) -> Algorithm:
    """The algorithm that defines the rule, for the problem's pass."""
    return registry.get("reference", problem.pass_)
