"""The integer codes the kernels' epilogues take, one meaning each on CPU and GPU.

:class:`Activation`: what a float conv's store applies after the bias (and residual):
the CPU forward kernels (``algorithms.blocked``, ``algorithms.depthwise``), the fused
pass (:mod:`convengine.fused_epilogue`) and the Triton kernels (``gpu.kernels``) take
these codes; each serves a subset (:data:`CPU_STORE`, :data:`FUSED`, :data:`GPU`).

:class:`Epilogue`: how an int8 conv finishes its int32 accumulator (the CPU int8
kernels' ``mode``, the Triton kernels' ``EPI``), or a float conv's float store (GPU).
"""

from __future__ import annotations

from enum import IntEnum


class Activation(IntEnum):
    """``act(v)`` after the bias: NaN passes ReLU and ReLU6 (ordered compares)."""

    NONE = 0
    RELU = 1  # max(v, 0)
    RELU6 = 2  # min(max(v, 0), 6)
    SILU = 3  # v * sigmoid(v)
    GELU = 4  # 0.5 v (1 + erf(v / sqrt 2))

    @classmethod
    def of(cls, name: str | None, allowed: tuple[Activation, ...] | None = None) -> Activation:
        """The code of ``name`` ("none" or None, "relu", "relu6", "silu", "gelu"); a
        ValueError names the ``allowed`` ones (default: all) if it is not one of them."""
        allowed = tuple(cls) if allowed is None else allowed
        key = "none" if name is None else name
        code = _BY_LABEL.get(key) if isinstance(key, str) else None
        if code is not None and code in allowed:  # one lookup: kernels ask on every call
            return code
        raise ValueError(f"activation must be one of {names(allowed)}, got {name!r}")

    @property
    def label(self) -> str:
        """The name the API takes ("none", "relu", ...)."""
        return self.name.lower()


_BY_LABEL = {code.label: code for code in Activation}


def names(codes: tuple[Activation, ...]) -> tuple[str, ...]:
    """The API names of ``codes``."""
    return tuple(c.label for c in codes)


#: what the CPU forward kernels' store applies (blocked, depthwise)
CPU_STORE = (Activation.NONE, Activation.RELU, Activation.RELU6)
#: what :mod:`convengine.fused_epilogue` applies
FUSED = (*CPU_STORE, Activation.SILU)
#: what the Triton kernels' float epilogue applies
GPU = (Activation.NONE, Activation.RELU, Activation.SILU, Activation.GELU)


class Epilogue(IntEnum):
    """How a kernel finishes its accumulator (see :mod:`convengine.quant.numerics`)."""

    REQUANT_FLOAT = 0  # PyTorch: float32 bias and steps, to 8 bits
    REQUANT_INT32 = 1  # ONNX QLinearConv: int32 bias, float64 steps, to 8 bits
    RAW = 2  # the int32 accumulator plus the int32 bias (ConvInteger)
    FLOAT = 3  # a float conv: bias and :class:`Activation` (GPU kernels)
