"""The heuristic: the algorithm ``auto`` runs when nothing was tuned.

Walks a per-pass preference list and stops at the first algorithm that can serve the
problem (``supports``) and suits it (accuracy, channels, enough Winograd tiles), so it
always ends at ``reference``, which serves everything.
"""

from __future__ import annotations

import math

from . import exactness, registry
from .algorithms import weight_cache
from .problem import ConvProblem
from .registry import Algorithm

# Preference of the heuristic, best first; names not registered are skipped and
# registered names missing here come just before "reference".
PREFERENCE = (
    "winograd4", "winograd", "blocked", "1x1", "im2col", "implicit_gemm", "flat_gemm",
    "direct", "reference",
)
# ``blocked`` (its own AVX-512 micro-kernel on convengine's threads) leads the GEMM
# algorithms, whose BLAS runs single-threaded (``convengine.threads``), wherever it
# serves. Measured 2026-11-30 on ResNet-50's layers (AMD EPYC, 2 vCPUs, quiet host):
# 1.2-3.5x the 1x1/im2col GEMMs alone at batch 8 and from 14x14 at batch 1; on the 7x7
# layers at batch 1, 1.7x in network order (their weights come from memory, which one
# BLAS thread cannot stream as fast): the convs of ResNet-50 b1 in order 27.7 ms
# against 40.6 with the 7x7 layers on the GEMMs (PyTorch's: 27.8).
# Winograd (fused kernel) where its transformed weights, re-read on every call, meet
# enough output tiles: F(4x4) from WINOGRAD4_MIN_TILES tiles of 4x4 per call, F(2x2)
# on any output of WINOGRAD_MIN_OUTPUT or more per dim. Measured 2026-11-30 on
# ResNet-50's 3x3 layers (AMD EPYC, single-threaded BLAS for im2col): F(4x4) best
# from 28x28 at batch 1 and on 7x7 at batch 8 (32 tiles, 2.9 ms against im2col's
# 20), F(2x2) on 14x14 and 7x7 at batch 1 (1.16 ms against im2col's 3.0).
WINOGRAD_MIN_OUTPUT = 7
WINOGRAD4_MIN_TILES = 32
# With transient weights (a training step's: ``weight_cache.transient``) every call
# transforms them anew, which only enough tiles repay. Measured 2026-12-01 on
# ResNet-50's 3x3 layers (AMD EPYC, new weights per call): F(4x4) 2.35 ms against
# blocked's 4.08 at 8x56x56 (1,568 tiles), 1.03 against 0.67 at 1x28x28 (49 tiles),
# 5.15 against 4.21 at 8x14x14 (128); F(2x2) 0.52 against 0.61 at 1x56x56 (784),
# 3.96 against 4.21 at 8x14x14 (392), 6.33 against 2.5 at 1x7x7 (16).
TRANSIENT_MIN_TILES = {2: 512, 4: 256}
WINOGRAD_TILE = {"winograd": 2, "winograd4": 4}  # output tile per spatial dim
DEPTHWISE_PREFERENCE = ("direct", "im2col", "reference")


def preference(problem: ConvProblem) -> list[str]:
    """The algorithm names of the problem's pass, best first, ``reference`` last."""
    names = registry.algorithms(problem.pass_)
    order = DEPTHWISE_PREFERENCE if problem.groups > 1 else PREFERENCE
    ranked = [n for n in order if n in names and n != "reference"]
    ranked += [n for n in names if n not in ranked and n != "reference"]
    return [*ranked, "reference"]


def _suits(problem: ConvProblem, algo: Algorithm) -> bool:
    """Speed and accuracy rules on top of ``supports``: exact algorithms only where
    ``exactness`` says so (float64, or inexact ones switched off); inexact ones
    (Winograd) and implicit_gemm's per-tap GEMMs only from 16 channels, Winograd only
    with enough tiles (``WINOGRAD4_MIN_TILES``, ``WINOGRAD_MIN_OUTPUT``)."""
    if not exactness.eligible(algo, problem):
        return False
    if algo.name == "implicit_gemm" and problem.in_channels < 16:
        return False
    if not algo.exact and min(problem.in_channels, problem.out_channels) < 16:
        return False  # Winograd's saving is in the GEMM; thin layers pay only transforms
    if algo.name in WINOGRAD_TILE and not _enough_tiles(problem, WINOGRAD_TILE[algo.name]):
        return False
    return True


def _enough_tiles(problem: ConvProblem, m: int) -> bool:
    if min(problem.out_size) < WINOGRAD_MIN_OUTPUT:
        return False
    tiles = problem.batch * math.prod(-(-n // m) for n in problem.out_size)
    if weight_cache.is_transient():
        return tiles >= TRANSIENT_MIN_TILES[m]
    return m == 2 or tiles >= WINOGRAD4_MIN_TILES


def heuristic(problem: ConvProblem) -> Algorithm:
    """The first algorithm in preference order that can serve the problem and suits it."""
    for name in preference(problem):
        algo = registry.get(name, problem.pass_)
        if algo.supports(problem) is None and (name == "reference" or _suits(problem, algo)):
            return algo
    raise AssertionError("unreachable: the reference algorithm serves every problem")
