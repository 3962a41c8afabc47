"""The host CPU's vector units, from LLVM's view of the host (read once at import).

The float kernels spell out their vectors: 512-bit ones (32 zmm registers) where the
CPU has AVX-512, 256-bit ones (16 ymm registers) where it has only AVX2 (AMD Zen 3,
older Intel). 512-bit vectors on an AVX2-only CPU are legal LLVM but run as pairs of
ymm halves whose register blocks no longer fit in the registers: every accumulator
spills (measured on an EPYC Zen 3: MobileNetV2's convs 3.3x slower than ONNX Runtime).
"""

from __future__ import annotations

import platform


def host_features() -> dict[str, bool]:
    """LLVM's feature flags of this CPU (``{"avx512f": True, ...}``); empty off x86."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    try:
        import llvmlite.binding as llvm

        return dict(llvm.get_host_cpu_features())
    except Exception:  # noqa: BLE001 - no feature list: assume the worst
        return {}


FEATURES = host_features()
HAS_AVX512 = bool(FEATURES.get("avx512f"))
VECTOR_BYTES = 64 if HAS_AVX512 else 32  # one register: zmm, else ymm
VECTOR_REGISTERS = 32 if HAS_AVX512 else 16
# a register block's accumulators: three quarters of the registers, the rest holding
# the operands of its multiply-adds (6 x 4 zmm, 6 x 2 ymm)
ACCUMULATORS = VECTOR_REGISTERS * 3 // 4
