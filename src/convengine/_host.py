"""The host CPU's vector units, from LLVM's view of the host, and its data caches'
sizes, from the OS (:data:`CACHES`); read once at import.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import _targets


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


def llvm_feature_string(cpu: dict[str, bool], allowed: dict[str, bool]) -> str:
    """LLVM's ``+f,-g,...`` over every feature of ``cpu``: ``+`` for those ``allowed``
    has on, ``-`` for the rest (a feature left out would take the CPU name's default,
    which for ``znver4`` or ``sapphirerapids`` includes AVX-512)."""
    return ",".join(("+" if allowed.get(f) else "-") + f for f in sorted(cpu))


def lower_llvm_target(cpu: dict[str, bool], allowed: dict[str, bool]) -> bool:
    """Make numba compile for ``allowed`` only (``$NUMBA_CPU_FEATURES``, re-read by
    numba's config), so that code LLVM generates by itself (vectorised loops, wider
    encodings of the kernels' own vectors) stays within the lowered level too. A
    ``$NUMBA_CPU_FEATURES`` the user set wins. Takes effect where numba has compiled
    nothing yet in this process (its target machine is made at the first compile):
    ``import convengine`` first. Returns whether the variable was set here."""
    enabled = {f for f, on in allowed.items() if on}
    if enabled == {f for f, on in cpu.items() if on} or os.environ.get("NUMBA_CPU_FEATURES"):
        return False
    os.environ["NUMBA_CPU_FEATURES"] = llvm_feature_string(cpu, allowed)
    from numba.core import config as numba_config

    numba_config.reload_config()
    return True


CPU_FEATURES = host_features()
CPU_ISA = _cpu_level(CPU_FEATURES)
# the level asked for, else a compile target's (see _targets), else the CPU's
ISA = _chosen_level(CPU_ISA, os.environ.get(ISA_ENV, "")
                    or (_targets.ACTIVE.isa if _targets.ACTIVE else ""))
FEATURES = _lowered(CPU_FEATURES, ISA)  # what the kernels may use
LLVM_TARGET_LOWERED = lower_llvm_target(CPU_FEATURES, FEATURES)
HAS_AVX2 = ISA_LEVELS.index(ISA) >= ISA_LEVELS.index("avx2")
HAS_AVX512 = ISA_LEVELS.index(ISA) >= ISA_LEVELS.index("avx512")
HAS_VNNI = ISA_LEVELS.index(ISA) >= ISA_LEVELS.index("avx512_vnni")
HAS_AMX = ISA == "amx"
VECTOR_BYTES = 64 if HAS_AVX512 else 32  # one register: zmm, else ymm
VECTOR_REGISTERS = 32 if HAS_AVX512 else 16
# a register block's accumulators: three quarters of the registers, the rest holding
# the operands of its multiply-adds (6 x 4 zmm, 6 x 2 ymm)
ACCUMULATORS = VECTOR_REGISTERS * 3 // 4


# ---------------------------------------------------------------- the caches

CACHE_DEFAULTS = {"l1d": 32 << 10, "l2": 512 << 10, "l3": 8 << 20}  # conservative
# sysconf's names, and glibc's numbers for them (Python's os.sysconf_names lacks them)
_SYSCONF_NAMES = {"l1d": ("SC_LEVEL1_DCACHE_SIZE", 188), "l2": ("SC_LEVEL2_CACHE_SIZE", 191),
                  "l3": ("SC_LEVEL3_CACHE_SIZE", 194)}
SYSFS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class CacheSizes:
    """The data caches one core sees, in bytes: L1d and L2 per core (an instance
    shared by several cores divided among them), L3 the whole instance (shared).
    ``sources``: how each was obtained, ``(("l1d", "sysfs"), ..., ("l3", "sysconf"))``."""

    l1d: int
    l2: int
    l3: int
    sources: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        """E.g. ``L1d 32 KiB, L2 1024 KiB, L3 32768 KiB (sysfs)``."""
        how = dict(self.sources)
        kinds = set(how.values())
        parts = [f"{name.upper().replace('D', 'd')} {getattr(self, name) >> 10} KiB"
                 + ("" if len(kinds) == 1 else f" ({how[name]})") for name in CACHE_DEFAULTS]
        return ", ".join(parts) + (f" ({kinds.pop()})" if len(kinds) == 1 else "")


def _cpu_count(text: str) -> int:
    """How many CPUs a sysfs list (``0-3,8``) names."""
    count = 0
    for item in text.strip().split(","):
        lo, _, hi = item.partition("-")
        count += int(hi) - int(lo) + 1 if hi else 1
    return count


def _size(text: str) -> int:
    """sysfs's ``32K``, ``1024K``, ``32M`` (or plain bytes) in bytes."""
    word = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(word[-1:], 1)
    return int(word.rstrip("KMG")) * scale


def _from_sysfs(root: Path) -> dict[str, int]:
    """Sizes from ``root/cpu0/cache/index*`` (Linux), per core for L1d and L2."""
    found: dict[str, int] = {}
    try:
        threads_per_core = _cpu_count((root / "cpu0/topology/thread_siblings_list").read_text())
    except (OSError, ValueError):
        threads_per_core = 1
    for index in sorted((root / "cpu0/cache").glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _size((index / "size").read_text())
            try:
                sharing = _cpu_count((index / "shared_cpu_list").read_text())
            except OSError:
                sharing = 1
        except (OSError, ValueError):
            continue
        if kind not in ("Data", "Unified") or size <= 0 or not 1 <= level <= 3:
            continue
        name = "l1d" if level == 1 else f"l{level}"
        cores = max(1, sharing // max(1, threads_per_core))
        found.setdefault(name, size if level == 3 else max(1, size // cores))
    return found


def _from_sysconf(sysconf: Callable[[str | int], int], glibc: bool) -> dict[str, int]:
    """Sizes from ``sysconf`` (glibc's view of CPUID: under a hypervisor it may name
    the host's whole L3, 320 MiB on a 32 MiB EPYC slice), where it knows them."""
    found = {}
    for name, (key, number) in _SYSCONF_NAMES.items():
        known = key in getattr(os, "sysconf_names", {})
        if not known and not glibc:
            continue
        try:
            size = int(sysconf(key if known else number))
        except (ValueError, OSError, TypeError):
            continue
        if size > 0:
            found[name] = size
    return found


def read_cache_sizes(root: Path = SYSFS_CPU,
                     sysconf: Callable[[str | int], int] | None = None) -> CacheSizes:
    """The cache sizes from sysfs under ``root``, else from ``sysconf`` (default
    ``os.sysconf``), else :data:`CACHE_DEFAULTS` (the reason recorded in ``sources``)."""
    sysfs = _from_sysfs(root)
    by_sysconf: dict[str, int] = {}
    if len(sysfs) < len(CACHE_DEFAULTS):
        glibc = platform.libc_ver()[0] == "glibc"
        if sysconf is None:
            sysconf = getattr(os, "sysconf", _no_sysconf)
        by_sysconf = _from_sysconf(sysconf, glibc)
    values, sources = {}, []
    for name, default in CACHE_DEFAULTS.items():
        if name in sysfs:
            values[name], how = sysfs[name], "sysfs"
        elif name in by_sysconf:
            values[name], how = by_sysconf[name], "sysconf"
        else:
            values[name], how = default, "default (neither sysfs nor sysconf reports it)"
        sources.append((name, how))
    return CacheSizes(values["l1d"], values["l2"], values["l3"], tuple(sources))


def _no_sysconf(name: str | int) -> int:
    raise ValueError(f"no sysconf on this system ({name})")


CACHES = read_cache_sizes()
