"""Tuning keys: which problems share one tuning result, and on which host.

A :class:`TuningKey` keeps exact what changes the best algorithm's code path (pass,
spatial rank, layout, dtype, kernel, stride, padding, dilation, groups, bias) and
rounds sizes up to a power of two (batch, channels, spatial), as CubeCL's
``anchor`` does. A stored result is valid only for the same host signature (CPU
model, ISA features, usable cores), convengine version and code of the algorithms
(a digest of their source files: a changed kernel is measured again) and candidate
set.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from .. import registry
from .._version import __version__
from ..problem import ConvProblem

# ISA features that change which kernel is fastest (names as in /proc/cpuinfo).
ISA_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "sve", "sve2", "i8mm", "bf16",
)


def bucket(n: int) -> int:
    """Round up to a power of two: 0 -> 0, 1 -> 1, 3 -> 4, 56 -> 64, 64 -> 64."""
    return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()


@dataclass(frozen=True)
class TuningKey:
    """The class of problems that share one tuning result; ``str`` is the cache key."""

    pass_: str
    ndim: int
    layout: str
    dtype: str
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    groups: int
    has_bias: bool
    batch: int
    in_channels: int
    out_channels: int
    in_size: tuple[int, ...]

    def __str__(self) -> str:
        def dims(t: tuple[int, ...]) -> str:
            return "x".join(map(str, t))

        pads = ",".join(f"{lo}:{hi}" for lo, hi in self.padding)
        return (
            f"{self.pass_} {self.ndim}d {self.layout} {self.dtype} k{dims(self.kernel)} "
            f"s{dims(self.stride)} p{pads} d{dims(self.dilation)} g{self.groups}"
            f"{' bias' if self.has_bias else ''} | N{self.batch} C{self.in_channels} "
            f"O{self.out_channels} S{dims(self.in_size)}"
        )


@functools.lru_cache(maxsize=4096)
def tuning_key(problem: ConvProblem) -> TuningKey:
    """The bucketed key of a problem (memoised: this is on the hot path)."""
    return TuningKey(
        pass_=problem.pass_,
        ndim=problem.ndim,
        layout=problem.layout,
        dtype=problem.dtype,
        kernel=problem.kernel,
        stride=problem.stride,
        padding=problem.padding,
        dilation=problem.dilation,
        groups=problem.groups,
        has_bias=problem.has_bias,
        batch=bucket(problem.batch),
        in_channels=bucket(problem.in_channels),
        out_channels=bucket(problem.out_channels),
        in_size=tuple(bucket(n) for n in problem.in_size),
    )


def _cpu_model_and_flags() -> tuple[str, set[str]]:
    """CPU model and ISA flags from /proc/cpuinfo (first CPU), else from platform."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                info.setdefault(name.strip(), value.strip())
    except OSError:
        pass  # not Linux: the model from platform is all we know
    model = info.get("model name") or info.get("Model") or platform.processor() or "unknown"
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return model, flags


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def host_signature() -> str:
    """E.g. ``x86_64 | Intel(R) Xeon(R) Processor | avx2,avx512f,amx_int8 | 2 cores``."""
    model, flags = _cpu_model_and_flags()
    isa = ",".join(f for f in ISA_FLAGS if f in flags) or "-"
    return f"{platform.machine()} | {model} | {isa} | {_usable_cores()} cores"


# checksums by the identities of the Algorithm objects; the objects are kept alive
# here so that their ids cannot be reused by other objects
_checksums: dict[tuple[int, ...], tuple[tuple[registry.Algorithm, ...], str]] = {}


def candidate_checksum(pass_: str) -> str:
    """A short hash of the registered algorithms of a pass and their attributes."""
    algorithms = tuple(registry.all_for(pass_))
    ids = tuple(map(id, algorithms))
    if ids not in _checksums:
        if len(_checksums) > 256:
            _checksums.clear()
        _checksums[ids] = (algorithms, _checksum(algorithms))
    return _checksums[ids][1]


def _checksum(algorithms: tuple[registry.Algorithm, ...]) -> str:
    items = sorted(
        (a.name, a.exact, a.deterministic, a.accuracy, a.run.__module__, a.run.__qualname__)
        for a in algorithms
    )
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=4096)
def key_text(problem: ConvProblem) -> str:
    """``str(tuning_key(problem))``, memoised."""
    return str(tuning_key(problem))


def version() -> str:
    """convengine's version and a digest of the code that was timed."""
    return f"{__version__}+{code_digest()}"


@functools.cache
def code_digest() -> str:
    """A digest of the algorithms' modules, the threading layer and the benchmark
    loop, read once per process: results timed on other kernels, or by another
    measuring procedure, are not taken."""
    package = Path(__file__).resolve().parent.parent
    files = sorted((package / "algorithms").glob("*.py")) + [package / "threads.py",
                                                            package / "tune" / "bench.py"]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]
