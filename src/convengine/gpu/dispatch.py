"""The public calls on device tensors: validate with the CPU API's problem builders,
pick a GPU algorithm, convert the operands once to canonical channels-last on the
device, run, and return a tensor on the same device in the caller's layout (NCHW
results are channels-last strided views, as torch's ``channels_last``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
import torch

from .. import builders, select
from ..devices import GPU_ALGORITHMS
from ..errors import ConvSetupError
from ..problem import ConvProblem
from . import tuning
from .algorithms import ALGORITHMS, GpuAlgorithm, activation_code, three

NUMPY_DTYPES: dict[torch.dtype, Any] = {
    torch.float32: np.float32, torch.float16: np.float16, torch.float64: np.float64,
    torch.bfloat16: ml_dtypes.bfloat16, torch.uint8: np.uint8, torch.int8: np.int8,
    torch.int32: np.int32,
}


class Meta(NamedTuple):
    """What the CPU problem builders read of an operand: shape, ndim, numpy dtype."""

    shape: tuple[int, ...]
    ndim: int
    dtype: np.dtype


def as_tensor(a: Any, name: str) -> torch.Tensor:
    """A torch tensor for ``a`` (DLPack arrays come in without a copy)."""
    if isinstance(a, torch.Tensor):
        return a
    if hasattr(a, "__dlpack__"):
        return torch.from_dlpack(a)
    raise TypeError(f"{name} must be a torch tensor or a DLPack array on the GPU, got "
                    f"{type(a).__name__}")


def meta(t: torch.Tensor) -> Any:
    """A :class:`Meta` of ``t``, which the builders read as they read an ndarray."""
    dtype = NUMPY_DTYPES.get(t.dtype)
    if dtype is None:
        raise ConvSetupError(f"unsupported dtype {t.dtype}; expected float32, float16 or bfloat16")
    return Meta(tuple(t.shape), t.dim(), np.dtype(dtype))


def check_device(algo: str, **tensors: torch.Tensor) -> torch.device:
    """The operands' common device: CUDA, or CPU under the interpreter with a GPU algo."""
    if algo != "auto" and algo not in GPU_ALGORITHMS:
        raise ConvSetupError(
            f"algo {algo!r} is not a GPU algorithm; CUDA operands take 'auto' or one of {GPU_ALGORITHMS}"
        )
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        listing = ", ".join(f"{k} on {t.device}" for k, t in tensors.items())
        raise ConvSetupError(f"operands must share one device, got {listing}")
    device = devices.pop()
    if device.type != "cuda" and not (tuning.INTERPRET and algo in GPU_ALGORITHMS):
        raise ConvSetupError(
            f"algo={algo!r} runs on CUDA tensors; got tensors on {device} (CPU tensors "
            f"reach the GPU kernels only under TRITON_INTERPRET=1)"
        )
    return device


def choose(problem: ConvProblem, algo: str) -> GpuAlgorithm:
    """``algo`` if it can serve ``problem`` (else ConvSetupError with its reason); for
    ``auto`` the implicit GEMM, then the direct kernel."""
    table = ALGORITHMS[problem.pass_]
    if algo == "auto":
        for candidate in table.values():
            if candidate.supports(problem) is None:
                return candidate
        reasons = "; ".join(f"{n}: {a.supports(problem)}" for n, a in table.items())
        raise ConvSetupError(f"no GPU algorithm serves {problem.describe()} ({reasons})")
    why = table[algo].supports(problem)
    if why is not None:
        raise ConvSetupError(f"algo {algo!r} cannot serve {problem.describe()}: {why}")
    return table[algo]


def canonical(t: torch.Tensor, layout: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """(N|O, C, *S) or (N|O, *S, C) -> contiguous (N|O, D, H, W, C), unit dims in front."""
    if layout == "NCHW":
        t = t.movedim(1, -1)
    t = t.reshape(t.shape[0], *(1,) * (5 - t.dim()), *t.shape[1:])
    return t.contiguous() if dtype is None else t.to(dtype).contiguous()


def restore(t: torch.Tensor, shape_nhwc: tuple[int, ...], layout: str) -> torch.Tensor:
    """Canonical 5-D result -> the caller's layout (NCHW as a channels-last view)."""
    t = t.reshape(shape_nhwc)
    return t.movedim(-1, 1) if layout == "NCHW" else t


def _bias(bias: Any, channels: int, device: torch.device) -> torch.Tensor | None:
    if bias is None:
        return None
    b = as_tensor(bias, "bias")
    if tuple(b.shape) != (channels,):
        raise ConvSetupError(f"bias has shape {tuple(b.shape)}, expected ({channels},) "
                             f"(one value per output channel)")
    return b.to(device=device, dtype=torch.float32).contiguous()


def conv(x: Any, w: Any, bias: Any = None, *, stride: Any = 1, padding: Any = 0,
         dilation: Any = 1, groups: int = 1, layout: str = "NCHW", algo: str = "auto",
         activation: str | None = None) -> torch.Tensor:
    """:func:`convengine.conv` on device tensors; ``activation`` (None, "relu", "silu",
    "gelu") is applied in the kernel's epilogue after the bias."""
    xt, wt = as_tensor(x, "x"), as_tensor(w, "w")
    device = check_device(algo, x=xt, w=wt)
    problem = builders.forward_problem(meta(xt), meta(wt), bias, stride=stride, padding=padding,
                                  dilation=dilation, groups=groups, layout=layout)
    chosen = choose(problem, algo)
    b = _bias(bias, problem.out_channels, device)
    y = chosen.run(problem, canonical(xt, problem.layout), canonical(wt, problem.layout), b,
                   activation_code(activation))
    return restore(y, problem.y_shape("NHWC"), problem.layout)


def conv_backward_data(dy: Any, w: Any, input_shape: Sequence[int], *, stride: Any = 1,
                       padding: Any = 0, dilation: Any = 1, groups: int = 1,
                       layout: str = "NCHW", algo: str = "auto") -> torch.Tensor:
    """:func:`convengine.conv_backward_data` on device tensors."""
    return _gradient("backward_data", {"dy": dy, "w": w}, input_shape, algo, stride=stride,
                     padding=padding, dilation=dilation, groups=groups, layout=layout)


def conv_backward_weight(x: Any, dy: Any, weight_shape: Sequence[int], *, stride: Any = 1,
                         padding: Any = 0, dilation: Any = 1, groups: int = 1,
                         layout: str = "NCHW", algo: str = "auto") -> torch.Tensor:
    """:func:`convengine.conv_backward_weight` on device tensors."""
    return _gradient("backward_weight", {"x": x, "dy": dy}, weight_shape, algo, stride=stride,
                     padding=padding, dilation=dilation, groups=groups, layout=layout)


def _gradient(pass_: str, operands: dict[str, Any], shape: Sequence[int], algo: str,
              **conv_args: Any) -> torch.Tensor:
    """A gradient call: ``operands`` the two tensors by name (dy and w, or x and dy),
    ``shape`` the one asked for (input_shape or weight_shape)."""
    tensors = {name: as_tensor(t, name) for name, t in operands.items()}
    check_device(algo, **tensors)
    a, b = tensors.values()
    problem = builders.BUILDERS[pass_](meta(a), meta(b), shape, **conv_args)
    chosen = choose(problem, algo)
    out = chosen.run(problem, canonical(a, problem.layout), canonical(b, problem.layout))
    return restore(out, problem.result_shape("NHWC"), problem.layout)


def conv_transpose(x: Any, w: Any, bias: Any = None, *, stride: Any = 1, padding: Any = 0,
                   output_padding: Any = 0, dilation: Any = 1, groups: int = 1,
                   layout: str = "NCHW", algo: str = "auto",
                   activation: str | None = None) -> torch.Tensor:
    """:func:`convengine.conv_transpose` on device tensors: the backward-data kernels
    with the bias and ``activation`` in their epilogue."""
    xt, wt = as_tensor(x, "x"), as_tensor(w, "w")
    device = check_device(algo, x=xt, w=wt)
    problem = builders.transpose_problem(meta(xt), meta(wt), bias, stride=stride, padding=padding,
                                    output_padding=output_padding, dilation=dilation,
                                    groups=groups, layout=layout)
    chosen = choose(problem, algo)
    a = canonical(xt, problem.layout)
    want = (problem.batch, *three(problem.out_size, 1), problem.out_channels)
    if tuple(a.shape) != want:  # x stands for a dy zero-extended at the end
        extra = [t - n for n, t in zip(a.shape, want)]
        a = torch.nn.functional.pad(a, [v for e in reversed(extra) for v in (0, e)])
    b = _bias(bias, problem.in_channels, device)
    y = chosen.run(problem, a, canonical(wt, problem.layout), b, activation_code(activation))
    return restore(y, problem.x_shape("NHWC"), problem.layout)


def explain(pass_: str, *args: Any, **kwargs: Any) -> select.Explanation:
    """:func:`convengine.explain` for device operands: the GPU algorithms' verdicts."""
    metas = [meta(as_tensor(a, f"argument {i}")) if hasattr(a, "shape") else a
             for i, a in enumerate(args)]
    problem = builders.BUILDERS[pass_](*metas, **kwargs)
    table = ALGORITHMS[problem.pass_]
    verdicts = {name: a.supports(problem) for name, a in table.items()}
    supported = tuple(n for n, why in verdicts.items() if why is None)
    return select.Explanation(
        problem, choose(problem, "auto").name, supported,
        {n: why for n, why in verdicts.items() if why is not None},
        {n: table[n].workspace_bytes(problem) for n in supported},
        source="GPU operands: the implicit GEMM where it serves, else the direct kernel")
