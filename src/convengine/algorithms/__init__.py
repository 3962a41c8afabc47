"""The algorithms; importing this package registers every one of them."""

from . import direct, im2col, implicit_gemm, pointwise, reference, winograd  # noqa: F401
