"""Quantized int8 convolution on the CPU: numerics (quantize, dequantize, requantize),
the kernels, and ``qconv`` (host arrays; ``convengine.qconv`` also takes device tensors)."""

from .cpu import HAS_AMX, HAS_VNNI, int8_path, set_int8_path
from .numerics import dequantize, quantize, quantize_per_channel, requantize
from .plan import qconv
from .prepack import clear_cache

__all__ = [
    "HAS_AMX",
    "HAS_VNNI",
    "clear_cache",
    "dequantize",
    "int8_path",
    "qconv",
    "quantize",
    "quantize_per_channel",
    "requantize",
    "set_int8_path",
]
