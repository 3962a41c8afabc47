"""The algorithms; importing this package registers every one of them.

Kernel families live in their own folders beside a numpy reference of what their
kernels compute: ``blocked`` (float GEMM micro-kernels), ``depthwise``, ``winograd``;
the int8 families are ``convengine.quant.dense`` and ``convengine.quant.depthwise``.
"""

from . import (  # noqa: F401
    blocked,
    depthwise,
    direct,
    flat_gemm,
    im2col,
    implicit_gemm,
    pointwise,
    reference,
    winograd,
)
