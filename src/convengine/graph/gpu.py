"""The graph API's plans on device tensors: the nodes of a float graph run one after
another (the ``unfused`` engine's order and numerics: values channels-last, carried in
float32, or float64 for float64 graphs, rounded to a float16/bfloat16 compute dtype
after every pointwise op; a conv's result is stored in the compute dtype once, as the
GPU kernels store it), the convs by the GPU algorithms, the pointwise ops by torch
on the device. int8 graphs (requantize, 8-bit tensors) are not served here yet."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import ConvSetupError
from ..gpu import dispatch
from .ir import CONV_OPS, QUANT_DTYPES, Tensor
from .program import Program, TensorSpec

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64,
                "float16": torch.float16, "bfloat16": torch.bfloat16}


def _internal(t: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    return t.movedim(1, -1) if spec.layout == "NCHW" else t


def _external(t: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    return t.movedim(-1, 1) if spec.layout == "NCHW" else t


def _check(prog: Program) -> None:
    quant = [n for n, t in prog.tensors.items() if t.dtype in QUANT_DTYPES or t.dtype == "int32"]
    if quant or any(node.op == "requantize" for node in prog.nodes):
        raise ConvSetupError(
            f"int8 graphs are not served on the GPU yet (8-bit or int32 tensors: {quant}); "
            f"run the plan on host arrays")


def _pointwise(op: str, attrs: dict[str, Any], a: torch.Tensor,
               b: torch.Tensor | None) -> torch.Tensor:
    if op in ("add", "bias"):
        assert b is not None
        return a + b
    if op == "mul":
        assert b is not None
        return a * b
    if op == "scale":
        return a * attrs["factor"]
    if op == "relu":
        return a.clamp_min(0)
    if op == "clamp":
        return a.clamp(attrs["lo"], attrs["hi"])
    if op == "sigmoid":
        return torch.sigmoid(a)
    if op == "silu":
        return torch.nn.functional.silu(a)
    if op == "gelu":
        return torch.nn.functional.gelu(a, approximate=attrs.get("approximate", "none"))
    raise ConvSetupError(f"pointwise op {op!r} is not served on the GPU")


def execute(prog: Program, bindings: Mapping[Any, Any]) -> dict[str, torch.Tensor]:
    """Run ``prog`` on ``{tensor or name: device tensor}``; outputs in their declared
    layout and delivered dtype, on the device."""
    _check(prog)
    carrier = torch.float64 if prog.compute_dtype == "float64" else torch.float32
    vals: dict[str, torch.Tensor] = {}
    for key, bound in bindings.items():
        name = key.name if isinstance(key, Tensor) else key
        spec = prog.tensors.get(name)
        if spec is None or spec.virtual:
            raise ConvSetupError(f"{name!r} is not an input of this graph; inputs: {prog.inputs}")
        t = dispatch.as_tensor(bound, name)
        if tuple(t.shape) != spec.shape or t.dtype != TORCH_DTYPES.get(spec.dtype):
            raise ConvSetupError(f"input {name!r} is {tuple(t.shape)} {t.dtype}, expected "
                                 f"{spec.shape} {spec.dtype} (as declared in the graph)")
        vals[name] = t
    if missing := [n for n in prog.inputs if n not in vals]:
        raise ConvSetupError(f"inputs not bound: {missing} (graph inputs: {prog.inputs})")

    def value(name: str) -> torch.Tensor:  # channels-last
        spec = prog.tensors[name]
        return vals[name] if spec.virtual else _internal(vals[name], spec)

    def operand(op: str, name: str, main: str) -> torch.Tensor:
        spec, mspec = prog.tensors[name], prog.tensors[main]
        a = (_external(vals[name], spec) if spec.virtual else vals[name]).to(carrier)
        if op == "bias":
            return a
        a = a.reshape((1,) * (len(mspec.shape) - a.dim()) + tuple(a.shape))
        return _internal(a, mspec)

    for node in prog.nodes:
        if node.op in CONV_OPS:
            problem = prog.problems[node.name]
            first, second = (value(n) for n in node.inputs)
            dtype = TORCH_DTYPES[problem.dtype]
            chosen = dispatch.choose(problem, "auto")
            out = chosen.run(problem, *(dispatch.canonical(t, "NHWC", dtype)
                                        for t in (first, second)))
            shape = {"forward": problem.y_shape, "backward_data": problem.x_shape,
                     "backward_weight": problem.w_shape}[problem.pass_]("NHWC")
            vals[node.output] = out.reshape(shape)
            continue
        a = value(node.inputs[0]).to(carrier)
        b = operand(node.op, node.inputs[1], node.inputs[0]) if len(node.inputs) > 1 else None
        out = _pointwise(node.op, node.attrs, a, b)
        if prog.compute_dtype in ("float16", "bfloat16"):
            out = out.to(TORCH_DTYPES[prog.compute_dtype]).to(carrier)
        vals[node.output] = out
    return {n: _external(vals[n], prog.tensors[n]).to(TORCH_DTYPES[prog.delivered_dtype(n)])
            for n in prog.outputs}
