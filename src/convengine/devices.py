"""Which device a call runs on, decided without importing torch or triton.

:func:`wanted` is true when an operand lives on a CUDA device (a torch tensor or any
DLPack array) or ``algo`` names a GPU algorithm; the fronts then hand the call to the
GPU backend (:mod:`convengine.gpu`, extra ``gpu``). With ``TRITON_INTERPRET=1`` the
GPU algorithms forced by name also take CPU torch tensors (Triton's interpreter runs
the kernels).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import ConvSetupError
from .problem import PASSES

GPU_ALGORITHMS = ("gpu_implicit_gemm", "gpu_direct")
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
    return (isinstance(algo, str) and algo in GPU_ALGORITHMS) or any(on_cuda(a) for a in arrays)


def gpu_algorithms(pass_: str = "forward") -> list[str]:
    """The GPU algorithms registered for ``pass_`` (all serve every pass)."""
    if pass_ not in PASSES:
        raise ConvSetupError(f"unknown pass {pass_!r}; expected one of {PASSES}")
    return list(GPU_ALGORITHMS)
