"""Operation graphs and execution plans: conv + pointwise epilogues, fused.

Describe a graph once (:class:`Graph`), ``build`` a cached :class:`Plan`, and
``execute`` it many times. See docs/guide/graph.md.
"""

from .builder import Graph
from .engines import ENGINES, Candidate
from .ir import GraphDefinition, GraphKey, Tensor
from .plan import DEFAULT_CACHE, Outputs, Plan, PlanCache, build_plan, candidates

__all__ = [
    "DEFAULT_CACHE",
    "ENGINES",
    "Candidate",
    "Graph",
    "GraphDefinition",
    "GraphKey",
    "Outputs",
    "Plan",
    "PlanCache",
    "Tensor",
    "build_plan",
    "candidates",
]
