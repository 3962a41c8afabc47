"""Zero-copy import of DLPack-capable arrays: numpy, torch CPU tensors, JAX CPU arrays.

Needs no framework: torch tensors are recognised by their attributes, so the core
imports this module without importing torch.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

_DLPACK_ERRORS = (TypeError, ValueError, BufferError, RuntimeError)


def _is_torch_bfloat16(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and str(value.dtype) == "torch.bfloat16"


def from_dlpack(value: Any) -> np.ndarray | None:
    """A numpy view sharing ``value``'s memory through DLPack, or None when DLPack
    cannot give one (a non-CPU device, an unsupported dtype).

    Torch tensors that require grad are detached first (a view, the engine never
    writes to its inputs); torch bfloat16 crosses as int16 and is viewed back as
    ``ml_dtypes.bfloat16``, since DLPack's bfloat16 is unknown to numpy.
    """
    if getattr(value, "requires_grad", False) and callable(getattr(value, "detach", None)):
        value = value.detach()
    bfloat16 = _is_torch_bfloat16(value)
    if bfloat16:
        value = value.view(sys.modules["torch"].int16)
    try:
        array = np.from_dlpack(value)
    except _DLPACK_ERRORS:
        return None
    if not bfloat16:
        return array
    import ml_dtypes  # ~0.6 s to import: only where a bfloat16 tensor arrives

    return array.view(ml_dtypes.bfloat16)


def dlpack_device(value: Any) -> str:
    """``value.__dlpack_device__()`` in words, for error messages."""
    try:
        kind, index = value.__dlpack_device__()
    except Exception:  # noqa: BLE001 - only used to phrase an error
        return "unknown"
    names = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
             10: "rocm", 14: "oneapi"}
    return f"{names.get(int(kind), f'type {kind}')}:{index}"
