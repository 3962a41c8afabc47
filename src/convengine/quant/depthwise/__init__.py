"""The int8 depthwise family: per-channel quantized convolution kernels.

- ``kernels``: the portable and VNNI (AVX-512) kernels and their generated rows.
- ``avx2``: the AVX2 kernels.
- ``reference``: numpy int64, exactly what they compute (per channel).
"""
