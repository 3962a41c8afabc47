"""ONNX interop: run ONNX models and single nodes on convengine (needs the ``onnx`` extra).

    import convengine.onnx as ceo
    sess = ceo.Session("model.onnx", threads=2)     # or a ModelProto, or the model's bytes
    (y,) = sess.run(None, {"input": x})             # like onnxruntime.InferenceSession
    outputs = ceo.run_model("model.onnx", [x])      # one-off: a Session, run once
    (y,) = ceo.run_node(node, [x, w, b])            # one NodeProto

Models are read with the onnx package's protobuf classes only (:mod:`.proto`): a
process that has not imported ``onnx`` does not pay its import (about a second).

Attribute semantics follow the current opset and the ONNX reference implementation
(``onnx.reference``). Tensors are NCHW, as ONNX defines them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import proto
from .ops import OPS, SINGLE_OUTPUT, Array, attributes
from .session import Session, TensorInfo, lookup, register_op, run_model, supported_ops

__all__ = ["OPS", "Session", "TensorInfo", "attributes", "register_op", "run_model", "run_node",
           "supported_ops"]

if TYPE_CHECKING:  # annotations only: nothing here imports onnx (about a second)
    import onnx


def run_node(node: onnx.NodeProto, inputs: Sequence[Any]) -> list[Array]:
    """Execute one ONNX node; ``inputs`` follow ``node.input`` (None for an omitted
    optional input). Returns the outputs in ``node.output`` order."""
    if not proto.is_message(node, "NodeProto"):
        raise TypeError(f"node must be an onnx.NodeProto, got {type(node).__name__}")
    fn = lookup(node.domain, node.op_type)
    if fn is None:
        raise NotImplementedError(
            f"ONNX operator {node.domain + '::' if node.domain else ''}{node.op_type} (node "
            f"{node.name!r}) is not supported by convengine.onnx; supported: "
            f"{', '.join(supported_ops())}")
    if node.op_type in SINGLE_OUTPUT and len([o for o in node.output if o]) > 1:
        raise NotImplementedError(
            f"{node.op_type} node {node.name!r} asks for {len(node.output)} outputs; "
            f"convengine.onnx produces only the first")
    return fn(list(inputs), attributes(node))

