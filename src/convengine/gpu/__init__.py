"""GPU algorithms written in Triton (extra ``gpu``), behind the same API.

This module is the gate the public functions consult: it imports neither torch nor
triton. :func:`wanted` is true when an operand lives on a CUDA device (a torch tensor
or any DLPack array) or ``algo`` names a GPU algorithm; the calls then go to
:mod:`convengine.gpu.dispatch`. With ``TRITON_INTERPRET=1`` the GPU algorithms forced
by name also take CPU torch tensors (Triton's interpreter runs the kernels).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConvSetupError
from ..problem import PASSES

NAMES = ("gpu_implicit_gemm", "gpu_direct")
_CUDA_DLPACK = (2, 13)  # kDLCUDA, kDLCUDAManaged


def on_cuda(a: Any) -> bool:
    """Whether ``a`` is an array on a CUDA device (without importing its library)."""
    if isinstance(a, np.ndarray):
        return False
    is_cuda = getattr(a, "is_cuda", None)  # a torch tensor answers without DLPack
    if isinstance(is_cuda, bool):
        return is_cuda
    device = getattr(a, "__dlpack_device__", None)
    if device is None:
        return False
    try:
        return int(device()[0]) in _CUDA_DLPACK
    except Exception:  # noqa: BLE001 - an exotic __dlpack_device__: not ours
        return False


def wanted(algo: Any, *arrays: Any) -> bool:
    """Route this call to the GPU: ``algo`` names a GPU algorithm or an operand is on CUDA."""
    return (isinstance(algo, str) and algo in NAMES) or any(on_cuda(a) for a in arrays)


def names(pass_: str = "forward") -> list[str]:
    """The GPU algorithms registered for ``pass_`` (all serve every pass)."""
    if pass_ not in PASSES:
        raise ConvSetupError(f"unknown pass {pass_!r}; expected one of {PASSES}")
    return list(NAMES)


def route(call: str, *args: Any, **kwargs: Any) -> Any:
    """Run the public call ``call`` ("conv", "qconv", "graph", ...) on the GPU path."""
    if call == "qconv":
        from . import quant

        return quant.qconv(*args, **kwargs)
    if call == "graph":
        from . import graph

        return graph.execute(*args, **kwargs)
    from . import dispatch

    return getattr(dispatch, call)(*args, **kwargs)


def autograd_fn(kind: str) -> Any:
    """convengine.torch's autograd Function for device tensors: "conv" or "conv_transpose"."""
    from . import autograd

    return autograd.ConvFn if kind == "conv" else autograd.ConvTransposeFn
