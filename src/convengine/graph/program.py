"""A validated graph frozen into what engines need: tensor specs, nodes, problems,
and (where the graph has that shape) its conv -> pointwise-chain structure."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ..problem import FLOAT_DTYPES, ConvProblem
from .ir import CONV_OPS, POINTWISE_OPS, GraphDefinition, Node


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str | None
    alignment: int
    virtual: bool
    output: bool


@dataclass(frozen=True)
class Chain:
    """One conv whose result flows through a straight line of pointwise ops into the
    graph's only output. ``prologue`` ops depend on graph inputs only (e.g. scaling a
    bias) and run once per execute; ``operands[i]`` is the side input of ``ops[i]``."""

    conv: Node
    ops: tuple[Node, ...]
    operands: tuple[str | None, ...]
    prologue: tuple[Node, ...]


@dataclass(frozen=True)
class Program:
    io_dtype: str
    compute_dtype: str
    tensors: dict[str, TensorSpec]
    nodes: tuple[Node, ...]
    problems: dict[str, ConvProblem]

    @staticmethod
    def from_graph(graph: GraphDefinition) -> Program:
        tensors = {
            t.name: TensorSpec(t.name, t.shape, t.dtype, t.layout, t.alignment,
                               t.is_virtual, t.is_output)
            for t in graph.tensors.values() if t.shape is not None
        }
        return Program(graph.io_dtype, graph.compute_dtype, tensors,
                       tuple(copy.deepcopy(graph.nodes)), dict(graph.problems))

    @property
    def inputs(self) -> list[str]:
        return [n for n, t in self.tensors.items() if not t.virtual]

    @property
    def outputs(self) -> list[str]:
        return [n for n, t in self.tensors.items() if t.output]

    @property
    def convs(self) -> list[Node]:
        return [n for n in self.nodes if n.op in CONV_OPS]

    def delivered_dtype(self, name: str) -> str:
        """Float outputs come back in io_dtype (when that is a float dtype)."""
        dt = self.tensors[name].dtype
        if dt in FLOAT_DTYPES and self.io_dtype in FLOAT_DTYPES:
            return self.io_dtype
        return dt

    def chain(self) -> Chain | str:
        """The conv -> pointwise chain, or the reason the graph is not one."""
        convs = self.convs
        if len(convs) != 1:
            return f"needs exactly one conv node, the graph has {len(convs)}"
        conv = convs[0]
        main, ops, operands, prologue = conv.output, [], [], []
        downstream = {conv.output}
        for node in self.nodes:
            if node is conv:
                continue
            if main in node.inputs:
                if node.op not in POINTWISE_OPS:
                    return f"node {node.name!r} ({node.op}) after the conv is not pointwise"
                if node.inputs.count(main) > 1:
                    return f"node {node.name!r} uses {main!r} twice"
                side = [n for n in node.inputs if n != main]
                if node.inputs[0] != main and node.op not in ("add", "mul"):
                    return f"node {node.name!r} ({node.op}) takes {main!r} as its operand"
                if uses := [n.name for n in self.nodes if main in n.inputs and n is not node]:
                    return f"{main!r} feeds more than one node ({node.name!r}, {uses[0]!r})"
                if self.tensors[main].output:
                    return f"intermediate {main!r} is also an output"
                ops.append(node)
                operands.append(side[0] if side else None)
                main = node.output
                downstream.add(main)
            elif downstream.intersection(node.inputs):
                return f"node {node.name!r} branches off the conv's chain"
            else:
                prologue.append(node)
        if self.outputs != [main]:
            return f"the chain ends at {main!r} but the outputs are {self.outputs}"
        for name in operands:
            if name in downstream:
                return f"operand {name!r} comes from the conv's own chain"
        return Chain(conv, tuple(ops), tuple(operands), tuple(prologue))
