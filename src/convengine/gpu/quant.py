"""``qconv`` on device tensors: int8 x int8 -> int32 (``tl.dot`` on tensor cores for
groups == 1, the direct kernel's exact int32 FMAs for groups), requantized in the
kernels' epilogue with the constants and float steps of the CPU ``qconv``
(:mod:`convengine.quant.numerics`), so that the results are bit-exact with it.

For the tensor-core path uint8 operands are shifted to int8 (``v - 128``, zero points
with them), and the zero points are folded out of the int32 dot afterwards:
``sum (a - za)(b - zb) = sum ab - zb sum a - za sum b + K za zb``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..epilogue_codes import Epilogue
from ..errors import ConvSetupError
from ..quant.plan import make_plan
from .algorithms import launch_conv, three
from .dispatch import as_tensor, canonical, check_device, meta, restore

_TORCH_OUT = {np.dtype(np.uint8): torch.uint8, np.dtype(np.int8): torch.int8,
              np.dtype(np.int32): torch.int32}


def _host(value: Any) -> Any:
    """Scales, zero points and bias are folded on the host (O values at most)."""
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value


def _to_int8(t: torch.Tensor) -> torch.Tensor:
    """uint8 ``v`` -> int8 ``v - 128``; int8 unchanged."""
    return (t.to(torch.int16) - 128).to(torch.int8) if t.dtype == torch.uint8 else t


def qconv(x_q: Any, x_scale: Any, x_zero_point: Any, w_q: Any, w_scale: Any,
          w_zero_point: Any, bias: Any = None, *, out_scale: Any = None,
          out_zero_point: Any = None, out_dtype: Any = np.uint8, relu: bool = False,
          bias_mode: str = "float", stride: Any = 1, padding: Any = 0, dilation: Any = 1,
          groups: int = 1, layout: str = "NCHW", algo: str = "auto") -> torch.Tensor:
    """:func:`convengine.qconv` on device tensors (x_q, w_q uint8/int8 torch tensors)."""
    xt, wt = as_tensor(x_q, "x_q"), as_tensor(w_q, "w_q")
    device = check_device(algo, x_q=xt, w_q=wt)
    for name, t in (("x_q", xt), ("w_q", wt)):
        if t.dtype not in (torch.uint8, torch.int8):
            raise ConvSetupError(f"{name} must be a tensor of dtype uint8 or int8, got {t.dtype}")
    mx, mw = meta(xt), meta(wt)
    plan = make_plan(mx.shape, mx.dtype, mw.shape, mw.dtype, _host(x_scale), _host(x_zero_point),
                 _host(w_scale), _host(w_zero_point), _host(bias), _host(out_scale),
                 _host(out_zero_point), out_dtype, relu, bias_mode, stride, padding,
                 dilation, groups, layout, "auto")
    problem, rq = plan.problem, plan.requant
    direct = algo == "gpu_direct" or (algo == "auto" and problem.groups != 1)
    if not direct and problem.groups != 1:
        raise ConvSetupError(f"algo 'gpu_implicit_gemm' cannot serve {problem.describe()}: "
                             f"groups={problem.groups} (gpu_direct serves groups)")
    x5, w5 = canonical(xt, problem.layout), canonical(wt, problem.layout)
    y = torch.empty((problem.batch, *three(problem.out_size, 1), problem.out_channels),
                    dtype=_TORCH_OUT[plan.out_dtype], device=device)
    mult = torch.as_tensor(rq.multiplier, device=device)
    bias_t = torch.as_tensor(rq.bias, device=device)
    wzp = plan.w_zero_point
    if direct:
        zps = torch.as_tensor(wzp.astype(np.int32), device=device)
        a, b, a_zp = x5, w5, plan.x_zero_point
    else:
        a, b = _to_int8(x5), _to_int8(w5)
        shift = 128 if wt.dtype == torch.uint8 else 0
        b_zp = torch.as_tensor((wzp - shift).astype(np.int32), device=device)
        colsum = b.reshape(b.shape[0], -1).to(torch.int32).sum(1, dtype=torch.int32)
        zps = torch.stack([b_zp, colsum], 1).contiguous()
        a_zp = plan.x_zero_point - (128 if xt.dtype == torch.uint8 else 0)
    quant = (mult, zps, a_zp, float(rq.zero_point), float(rq.lo), float(rq.hi))
    launch_conv(problem, a, b, y, backward_data=False, direct=direct, bias=bias_t,
                epi=Epilogue(plan.mode), quant=quant)
    return restore(y, problem.y_shape("NHWC"), problem.layout)
