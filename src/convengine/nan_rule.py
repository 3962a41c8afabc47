"""The NaN rule: NaN and infinity give the same outputs whatever algorithm runs.

Each pass computes the sum its definition writes down, in IEEE arithmetic, as the
float64 ``reference`` does: forward and backward-weight sum over the zero-padded
input, so a padded tap adds ``0 * w`` (forward) or ``0 * dy`` (backward-weight),
which is NaN where that value is NaN or infinite; backward-data (and so the
transposed conv) sums ``dy * w`` over the pairs that land inside x, with no padded
terms. The fast algorithms agree with it on finite operands but not always on
non-finite ones: some skip padded taps (``direct``, Winograd), some multiply dy's zero
extension by w (backward-data through the transpose rule). So a call whose operands
could tell them apart is computed again by the reference. The checks are vectorised
passes over the smaller of the two arrays that can tell (microseconds next to the
convolution):

- forward, padded: w holds a NaN or an infinity. A fast algorithm's y then holds one
  too wherever the tap meets x, so where y is smaller than w and every tap meets x
  somewhere, a finite y clears the call without reading w;
- backward-data, not 1x1: w holds one (the fast algorithms differ only by extra NaNs:
  a finite dx clears the call the same way);
- backward-weight, padded: the result holds one (then dy or x did), or, where some
  output position has no tap inside x at all, dy holds one.
"""

from __future__ import annotations

import functools

import numpy as np

from . import registry
from .finite import nonfinite
from .problem import ConvProblem
from .registry import Algorithm


def _padded(problem: ConvProblem) -> bool:
    return any(p != (0, 0) for p in problem.padding)


@functools.lru_cache(maxsize=1024)
def _blind(problem: ConvProblem) -> tuple[bool, bool]:
    """(some kernel tap lands in the padding for every output position, some output
    position may have no tap inside x), over the spatial dims. The second is a safe
    over-estimate: the padding reaches a whole dilated kernel or the dilation steps
    over all of x."""
    blind_tap = blind_output = False
    for n, k, o, s, d, (lo, hi), extent in zip(
            problem.in_size, problem.kernel, problem.out_size, problem.stride,
            problem.dilation, problem.padding, problem.effective_kernel):
        start = np.arange(k, dtype=np.int64) * d - lo  # x index each tap reads at p = 0
        first = np.maximum(0, -(start // s))  # first output whose tap lands inside x
        last = np.minimum(o - 1, (n - 1 - start) // s)
        blind_tap |= bool((first > last).any())
        blind_output |= max(lo, hi) >= extent or d > n
    return blind_tap, blind_output


def _nonfinite_operand(problem: ConvProblem, b: np.ndarray, out: np.ndarray) -> bool:
    """Whether w (``b``) holds a NaN or an infinity, read only where ``out`` (the fast
    algorithm's result) cannot clear it first."""
    if b.size <= out.size or _blind(problem)[0]:
        return bool(nonfinite(b))
    return bool(nonfinite(out)) and bool(nonfinite(b))


def must_recompute(problem: ConvProblem, algorithm: Algorithm, b: np.ndarray,
                   out: np.ndarray) -> bool:
    """Whether ``out``, what ``algorithm`` returned for operands (a, ``b``) (``b``: w for
    forward and backward-data, dy for backward-weight), must be recomputed by the
    reference to follow the rule."""
    if algorithm.name == "reference":
        return False
    if problem.pass_ == "forward":
        return _padded(problem) and _nonfinite_operand(problem, b, out)
    if problem.pass_ == "backward_data":
        return not problem.is_pointwise and _nonfinite_operand(problem, b, out)
    return _padded(problem) and (bool(nonfinite(out))
                                 or (_blind(problem)[1] and bool(nonfinite(b))))


def reference(problem: ConvProblem) -> Algorithm:
    """The algorithm that defines the rule, for the problem's pass."""
    return registry.get("reference", problem.pass_)
