"""Operation graphs and execution plans: conv + pointwise epilogues, fused.

Describe a graph once (:class:`Graph`), ``build`` a cached :class:`Plan`, and
``execute`` it many times. See docs/graph.md.
"""

from .engines import ENGINES, Candidate
from .ir import Graph, GraphKey, Tensor
from .plan import DEFAULT_CACHE, Outputs, Plan, PlanCache, build_plan, candidates

__all__ = [
    "DEFAULT_CACHE",
    "ENGINES",
    "Candidate",
    "Graph",
    "GraphKey",
    "Outputs",
    "Plan",
    "PlanCache",
    "Tensor",
    "build_plan",
    "candidates",
]
