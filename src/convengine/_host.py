"""The host CPU's vector units, from LLVM's view of the host (read once at import).

The float kernels spell out their vectors: 512-bit ones (32 zmm registers) where the
CPU has AVX-512, 256-bit ones (16 ymm registers) where it has only AVX2 (AMD Zen 3,
older Intel). 512-bit vectors on an AVX2-only CPU are legal LLVM but run as pairs of
ymm halves whose register blocks no longer fit in the registers: every accumulator
spills (measured on an EPYC Zen 3: MobileNetV2's convs 3.3x slower than ONNX Runtime).
"""

from __future__ import annotations

import ctypes
import os
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


def request_amx() -> bool:
    """Ask Linux for AMX tile state (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.syscall(158, 0x1023, 18) == 0)  # SYS_arch_prctl
    except (OSError, AttributeError):
        return False


# The instruction-set levels the kernels know, lowest first, and the LLVM features
# each adds. ``CONVENGINE_ISA`` lowers the level (never above the CPU's), so that one
# host runs every path: the AVX2 kernels on an AVX-512 CPU, for example.
ISA_LEVELS = ("none", "avx2", "avx512", "avx512_vnni", "amx")
_LEVEL_FEATURES = {
    "avx2": ("avx2", "fma"),
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "avx512_vnni": ("avx512vnni",),
    "amx": ("amx-int8", "amx-tile"),
}
ISA_ENV = "CONVENGINE_ISA"


def _cpu_level(features: dict[str, bool]) -> str:
    """The highest level whose features (and those of every level below) the CPU has."""
    level = "none"
    for name in ISA_LEVELS[1:]:
        if not all(features.get(f) for f in _LEVEL_FEATURES[name]):
            break
        if name == "amx" and not request_amx():
            break
        level = name
    return level


def _chosen_level(cpu: str, requested: str) -> str:
    """``requested`` (from ``$CONVENGINE_ISA``; empty: the CPU's) checked against the CPU."""
    word = requested.strip().lower()
    if not word:
        return cpu
    if word not in ISA_LEVELS:
        raise ValueError(f"${ISA_ENV} must be one of {', '.join(ISA_LEVELS)} (or unset: "
                         f"the CPU's), got {requested!r}")
    allowed = ISA_LEVELS[:ISA_LEVELS.index(cpu) + 1]
    if word not in allowed:
        raise ValueError(f"${ISA_ENV}={word!r} is above this CPU's instruction set {cpu!r} "
                         f"(allowed here: {', '.join(allowed)})")
    return word


def _lowered(features: dict[str, bool], level: str) -> dict[str, bool]:
    """``features`` without those of the levels above ``level`` (and every AVX-512 or
    AMX extension below those levels: ``avx512vbmi``, ``amx-bf16``, ...)."""
    above = ISA_LEVELS[ISA_LEVELS.index(level) + 1:]
    dropped = {f for name in above for f in _LEVEL_FEATURES[name]}
    families = tuple(family for family in ("avx512", "amx") if family in above)
    dropped |= {f for f in features if f.startswith(families)}
    return {f: v for f, v in features.items() if f not in dropped}


CPU_FEATURES = host_features()
CPU_ISA = _cpu_level(CPU_FEATURES)
ISA = _chosen_level(CPU_ISA, os.environ.get(ISA_ENV, ""))
FEATURES = _lowered(CPU_FEATURES, ISA)  # what the kernels may use
HAS_AVX2 = ISA_LEVELS.index(ISA) >= ISA_LEVELS.index("avx2")
HAS_AVX512 = ISA_LEVELS.index(ISA) >= ISA_LEVELS.index("avx512")
HAS_VNNI = ISA_LEVELS.index(ISA) >= ISA_LEVELS.index("avx512_vnni")
HAS_AMX = ISA == "amx"
VECTOR_BYTES = 64 if HAS_AVX512 else 32  # one register: zmm, else ymm
VECTOR_REGISTERS = 32 if HAS_AVX512 else 16
# a register block's accumulators: three quarters of the registers, the rest holding
# the operands of its multiply-adds (6 x 4 zmm, 6 x 2 ymm)
ACCUMULATORS = VECTOR_REGISTERS * 3 // 4
