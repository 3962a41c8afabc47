"""Portable compile targets, and the shipped kernels compiled for them.

numba compiles for the host CPU by default (its name and features), and its on-disk
cache is keyed on them, so kernels compiled on one machine load on no other. A
*target* is a portable CPU description (an x86-64 micro-architecture level plus
features) that many CPUs cover: code compiled for it runs, and loads from a cache, on
any of them. ``convengine build-cache --target NAME`` compiles a model suite's kernels
for a target into a directory that a built wheel carries (``convengine/_shipped/
<target>/``); at ``import convengine`` this module picks the shipped target the host
matches (the one whose instruction-set level is the host's own: an AMX host compiles
for itself rather than lose its AMX kernels), and sets ``NUMBA_CPU_NAME`` /
``NUMBA_CPU_FEATURES`` for it before numba compiles anything, so that the shipped
machine code loads (``_kernel_cache`` seeds the user's kernel cache from it).

No target is used where the user chose one already (``NUMBA_CPU_NAME``,
``NUMBA_CPU_FEATURES``, ``CONVENGINE_ISA``), where ``CONVENGINE_SHIPPED=0``, where no
shipped directory fits this Python, or off Linux x86-64; then numba compiles for the
host, as without shipped kernels. ``CONVENGINE_TARGET=NAME`` compiles for a target
whether or not kernels were shipped for it (what ``build-cache`` runs); a process using
a target sets it, with the target's ``NUMBA_CPU_*``, so that the processes it starts
use the same target and shipped kernels.

This module imports nothing heavy: it runs at ``import convengine``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

SHIPPED_ENV = "CONVENGINE_SHIPPED"  # "0": never use shipped kernels
SHIPPED_DIR_ENV = "CONVENGINE_SHIPPED_DIR"  # where shipped targets lie (default: in the package)
TARGET_ENV = "CONVENGINE_TARGET"  # compile for this target
MANIFEST = "TARGET.json"
PACKAGED = Path(__file__).parent / "_shipped"  # the shipped targets a wheel carries
_USER_CHOICES = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "CONVENGINE_ISA")

_V3_FLAGS = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_V4_FLAGS = (*_V3_FLAGS, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")


class ShippedKernelWarning(UserWarning):
    """Shipped kernels that do not fit this installation: compiled instead."""


class Target(NamedTuple):
    """A portable compile target: LLVM's CPU name and feature string for numba, the
    instruction-set level of convengine's kernels (``_host.ISA_LEVELS``) and the
    ``/proc/cpuinfo`` flags a CPU needs to run its code."""

    name: str
    llvm_cpu: str
    llvm_features: str
    isa: str
    flags: tuple[str, ...]


TARGETS = {t.name: t for t in (
    Target("x86-64-v3", "x86-64-v3", "+avx2,+fma", "avx2", _V3_FLAGS),
    Target("x86-64-v4", "x86-64-v4", "+avx512f", "avx512", _V4_FLAGS),
    Target("x86-64-v4-vnni", "x86-64-v4", "+avx512vnni", "avx512_vnni",
           (*_V4_FLAGS, "avx512_vnni")),
)}


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's flags in ``cpuinfo``; empty where there is none."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def isa_level(flags: frozenset[str]) -> str:
    """The instruction-set level (``_host.ISA_LEVELS``) of a CPU with ``flags``."""
    if not set(_V3_FLAGS) <= flags:
        return "none"
    if not set(_V4_FLAGS) <= flags:
        return "avx2"
    if "avx512_vnni" not in flags:
        return "avx512"
    return "amx" if {"amx_int8", "amx_tile"} <= flags else "avx512_vnni"


def runs_on(target: Target, flags: frozenset[str]) -> bool:
    """Whether a CPU with ``flags`` runs ``target``'s code at its own level."""
    return set(target.flags) <= flags and isa_level(flags) == target.isa


def shipped_dir() -> Path:
    """Where shipped targets lie: ``$CONVENGINE_SHIPPED_DIR``, else :data:`PACKAGED`."""
    own = os.environ.get(SHIPPED_DIR_ENV)
    return Path(own) if own else PACKAGED


def _manifest(folder: Path) -> dict[str, object] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def python_version() -> str:
    """This Python's ``major.minor`` (what a manifest's kernels are for)."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def lookup(name: str, flags: frozenset[str], what: str) -> Target:
    """The target ``name`` (given as ``what``); ValueError if unknown or if a CPU with
    ``flags`` cannot run its code."""
    if name not in TARGETS:
        raise ValueError(f"{what} must be one of {', '.join(TARGETS)}, got {name!r}")
    target = TARGETS[name]
    missing = set(target.flags) - flags
    if missing:
        raise ValueError(f"{what}={name}: this CPU cannot run {name} code (this CPU lacks "
                         f"{', '.join(sorted(missing))})")
    return target


def _own_settings(target: Target) -> dict[str, str]:
    """The variables that say what ``target`` says: set with ``$CONVENGINE_TARGET``
    (by the user, or inherited from a parent process compiling for it), they agree."""
    return {"NUMBA_CPU_NAME": target.llvm_cpu, "NUMBA_CPU_FEATURES": target.llvm_features,
            "CONVENGINE_ISA": target.isa}


def _forced(environ: dict[str, str] | os._Environ[str], name: str,
            flags: frozenset[str]) -> Target:
    """The target ``$CONVENGINE_TARGET`` names, checked against the CPU and the other
    variables (each unset or the target's own)."""
    target = lookup(name, flags, f"${TARGET_ENV}")
    clash = [c for c, own in _own_settings(target).items()
             if environ.get(c) and environ[c].strip().lower() != own.lower()]
    if clash:
        raise ValueError(f"${TARGET_ENV}={name} sets the compile target: unset "
                         f"{', '.join('$' + c for c in clash)}")
    return target


def _shipped_for(target: Target, folder: Path) -> Path | None:
    """``folder``'s kernels for ``target`` if it has them for this Python (one warning
    if they are for another, or unreadable)."""
    shipped = folder / target.name
    if not (shipped / MANIFEST).is_file():
        return None
    manifest = _manifest(shipped)
    if manifest is None or manifest.get("python") != python_version():
        _warn(f"the shipped kernels in {shipped} are for Python "
              f"{(manifest or {}).get('python', '(unreadable manifest)')}, not {python_version()}: "
              "compiling instead")
        return None
    return shipped


def _choose(environ: dict[str, str] | os._Environ[str], flags: frozenset[str],
            folder: Path) -> tuple[Target | None, Path | None]:
    """(the target to compile for, the folder of its shipped kernels or None)."""
    shipping = environ.get(SHIPPED_ENV, "").strip() != "0"
    forced = environ.get(TARGET_ENV, "").strip()
    if forced:
        target = _forced(environ, forced, flags)
        return target, _shipped_for(target, folder) if shipping else None
    if not shipping or any(environ.get(c) for c in _USER_CHOICES):
        return None, None
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None, None
    for target in TARGETS.values():
        if runs_on(target, flags) and (folder / target.name / MANIFEST).is_file():
            shipped = _shipped_for(target, folder)
            return (target, shipped) if shipped is not None else (None, None)
    return None, None


def _warn(message: str) -> None:
    warnings.warn(f"convengine: {message}", ShippedKernelWarning, stacklevel=3)


def _activate(target: Target) -> None:
    """Make numba compile for ``target`` (before its first compilation), in this
    process and in the child processes it starts (``$CONVENGINE_TARGET``)."""
    os.environ["NUMBA_CPU_NAME"] = target.llvm_cpu
    os.environ["NUMBA_CPU_FEATURES"] = target.llvm_features
    os.environ[TARGET_ENV] = target.name
    config = sys.modules.get("numba.core.config")
    if config is not None:  # numba imported already: read the variables again
        config.reload_config()


def drop(reason: str) -> None:
    """Stop using the shipped kernels (they do not fit: ``reason``), one warning; the
    compile target stays (numba may have compiled for it already)."""
    global SHIPPED
    if SHIPPED is not None:
        _warn(f"the shipped kernels in {SHIPPED} are not used: {reason}; compiling "
              "instead")
    SHIPPED = None


def manifest() -> dict[str, object]:
    """The active shipped target's manifest (empty where there is none)."""
    return (_manifest(SHIPPED) or {}) if SHIPPED is not None else {}


def _numba_compiled_already() -> bool:
    """Whether numba made its CPU target machine (at its first compilation) already:
    then it compiles for the host whatever the variables say."""
    registry = sys.modules.get("numba.core.registry")
    cpu_target = getattr(registry, "cpu_target", None)
    return cpu_target is not None and "_toplevel_target_context" in vars(cpu_target)


ACTIVE, SHIPPED = _choose(os.environ, cpu_flags(), shipped_dir())
if ACTIVE is not None and _numba_compiled_already():
    _warn(f"numba compiled something before convengine was imported, for this CPU: not "
          f"compiling for {ACTIVE.name} (import convengine first to use shipped kernels)")
    ACTIVE = SHIPPED = None
if ACTIVE is not None:
    _activate(ACTIVE)
