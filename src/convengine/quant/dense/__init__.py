"""The int8 dense family: quantized convolution kernels over packed int8 panels.

- ``kernels``: the drivers (portable, AVX2, VNNI, AMX) and their shared epilogue.
- ``vnni``, ``amx``, ``avx2``: the micro-kernels per instruction set (LLVM IR).
- ``reference``: numpy int64, exactly what they compute (the general grouped conv).
"""
