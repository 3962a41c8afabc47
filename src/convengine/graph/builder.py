"""The user's graph: a :class:`~convengine.graph.ir.GraphDefinition` that can build its plan."""

from __future__ import annotations

from .ir import GraphDefinition
from .plan import Plan, PlanCache, build_plan


class Graph(GraphDefinition):
    """A small operation graph: one or more convs and their pointwise epilogue.

    ``io_dtype`` is the default dtype of inputs and the dtype float outputs are
    returned in; ``compute_dtype`` is the dtype of float intermediates (float16 and
    bfloat16 are reduced precision: engines refuse them unless allowed).
    ``layout`` is declared here once, for every rank 3-5 tensor: ``"NCHW"`` (the
    default, as for :func:`convengine.conv`) or ``"NHWC"``; ``tensor(..., layout=)``
    may override it for one input. Describe it op by op, then :meth:`build` a plan.
    """

    def build(self, policy: str = "heuristic", *, deterministic: bool = False,
              allow_reduced_precision: bool = False, cache: PlanCache | None = None) -> Plan:
        """Validate, then return the (cached) execution plan; see :func:`build_plan`."""
        return build_plan(self, policy=policy, deterministic=deterministic,
                          allow_reduced_precision=allow_reduced_precision, cache=cache)
