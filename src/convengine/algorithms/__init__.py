"""The algorithms; importing this package registers every one of them."""

from . import (  # noqa: F401
    blocked,
    blocked_weight,
    direct,
    flat_gemm,
    im2col,
    implicit_gemm,
    pointwise,
    reference,
    winograd,
)
