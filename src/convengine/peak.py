"""The host's measured compute peak: float32 FMA GFLOP/s and int8 VNNI GOPS.

A short loop of independent multiply-add chains in the kernels' vectors
(:data:`convengine._host.VECTOR_BYTES`: zmm with AVX-512, else ymm), :data:`CHAINS`
of them so that the FMA units' latency is hidden (4 cycles x 2 units needs 8), run on
1 thread and on ``n`` threads for about :data:`SECONDS`; the best of a few runs. The
int8 peak is the same loop of ``vpdpbusd`` (64 byte products summed into 16 int32
lanes: 128 operations) where the instruction set has AVX-512 VNNI; elsewhere it is
not measured (``int8_gops`` None, the reason in ``note``).

:func:`peak` measures once per host and keeps the result in ``<cache dir>/peak.json``
keyed on the CPU's name, the instruction-set level, the thread count and convengine's
version; an unreadable or corrupt file is measured again and rewritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _host, config
from ._version import __version__

CHAINS = 12  # independent accumulators: 12 vectors + 2 operands fit 16 ymm or 32 zmm
SECONDS = 0.2  # measured time per thread count and kind, split into ROUNDS runs
ROUNDS = 100  # the best run counts: short runs (2 ms), some free of other processes
FILE = "peak.json"
BUSY = "the host was busy"  # in a note: the peak is too low, and not stored
_FP32_LANES = _host.VECTOR_BYTES // 4
_VNNI_LANES = 16  # int32 lanes of a zmm


def _chains_intrinsic(kind: str) -> Any:
    """An intrinsic ``f(acc, reps)`` over the flat array ``acc``: CHAINS vectors of
    accumulators, then two of operands; ``reps`` times each accumulator is updated
    by one ``fma(acc, a, b)`` (``kind`` "fp32") or ``vpdpbusd(acc, a, b)`` ("vnni"),
    the results stored back (so that nothing is optimized away)."""
    fp32 = kind == "fp32"
    lanes = _FP32_LANES if fp32 else _VNNI_LANES
    vec = ir.VectorType(ir.FloatType() if fp32 else ir.IntType(32), lanes)
    array_type: Any = types.Array(types.float32 if fp32 else types.int32, 1, "C")

    @intrinsic
    def chains(typingctx, acc, reps):
        if acc != array_type or not isinstance(reps, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            base = builder.bitcast(data, vec.as_pointer())
            ptrs = [builder.gep(base, [ir.Constant(ir.IntType(64), i)])
                    for i in range(CHAINS + 2)]
            a, b = (builder.load(p, align=4) for p in ptrs[CHAINS:])
            name = (f"llvm.fma.v{lanes}f32" if fp32
                    else "llvm.x86.avx512.vpdpbusd.512")
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec, vec, vec]), name)
            count = context.cast(builder, args[1], signature.args[1], types.int64)
            entry = builder.block
            loop = builder.append_basic_block("chains.loop")
            done = builder.append_basic_block("chains.done")
            start = [builder.load(p, align=4) for p in ptrs[:CHAINS]]  # numpy: unaligned
            zero = ir.Constant(ir.IntType(64), 0)
            builder.cbranch(builder.icmp_signed(">", count, zero), loop, done)
            builder.position_at_end(loop)
            i = builder.phi(ir.IntType(64))
            accs = [builder.phi(vec) for _ in range(CHAINS)]
            new = [builder.call(fn, [acc, a, b]) for acc in accs]
            nxt = builder.add(i, ir.Constant(ir.IntType(64), 1))
            builder.cbranch(builder.icmp_signed("<", nxt, count), loop, done)
            i.add_incoming(zero, entry)
            i.add_incoming(nxt, loop)
            for phi, first, updated in zip(accs, start, new):
                phi.add_incoming(first, entry)
                phi.add_incoming(updated, loop)
            builder.position_at_end(done)
            final = [builder.phi(vec) for _ in range(CHAINS)]
            for out, ptr, first, updated in zip(final, ptrs, start, new):
                out.add_incoming(first, entry)
                out.add_incoming(updated, loop)
                builder.store(out, ptr, align=4)
            return context.get_dummy_value()

        return types.none(acc, reps), codegen

    return chains


_fp32_chains = _chains_intrinsic("fp32")
_vnni_chains = _chains_intrinsic("vnni")


def _runners(chains: Any) -> tuple[Any, Any]:
    """(serial, parallel) kernels running ``chains`` on one accumulator row each."""

    @njit(nogil=True)
    def serial(acc, reps):
        chains(acc[0], reps)

    @njit(nogil=True, parallel=True)
    def parallel(acc, reps):
        for t in prange(acc.shape[0]):
            chains(acc[t], reps)

    return serial, parallel


_fp32_serial, _fp32_parallel = _runners(_fp32_chains)
_vnni_serial, _vnni_parallel = _runners(_vnni_chains)


def _timed(fn: Any, acc: np.ndarray, reps: int) -> float:
    t0 = time.perf_counter()
    fn(acc, reps)
    return time.perf_counter() - t0


def _rate(kind: str, n: int, seconds: float) -> float:
    """Operations per second of ``n`` threads each running the chains of ``kind``."""
    lanes = _FP32_LANES if kind == "fp32" else _VNNI_LANES
    if kind == "fp32":
        acc = np.full((n, (CHAINS + 2) * lanes), 1.0, np.float32)
        acc[:, CHAINS * lanes:(CHAINS + 1) * lanes] = 0.999999  # a: shrinks slowly ...
        acc[:, (CHAINS + 1) * lanes:] = 1e-6  # ... b: toward 1, no overflow or denormals
        fn = _fp32_serial if n == 1 else _fp32_parallel
        per_rep = 2 * CHAINS * lanes  # a multiply and an add per lane
    else:
        acc = np.zeros((n, (CHAINS + 2) * lanes), np.int32)
        acc[:, CHAINS * lanes:] = 0x01010101  # bytes of 1: sums grow slowly, wrap harmlessly
        fn = _vnni_serial if n == 1 else _vnni_parallel
        per_rep = 2 * CHAINS * lanes * 4  # 4 byte products and their sums per lane
    serial = _fp32_serial if kind == "fp32" else _vnni_serial
    fn(acc, 1)  # compile (and start the threads)
    serial(acc, 1)
    target, reps = seconds / ROUNDS, 1 << 8
    while True:  # calibrate on one thread (no start-up costs) to runs of about target
        elapsed = min(_timed(serial, acc, reps) for _ in range(3))
        if elapsed >= target / 4 or reps >= 1 << 40:
            break
        reps *= 4
    reps = max(1, int(reps * target / max(elapsed, 1e-9)))
    best, spent, runs = 0.0, 0.0, 0
    while (spent < seconds or runs < ROUNDS) and runs < 4 * ROUNDS:
        elapsed = _timed(fn, acc, reps)
        best = max(best, n * reps * per_rep / elapsed)
        spent, runs = spent + elapsed, runs + 1
        if elapsed < target / 2:  # calibrated while other processes ran: lengthen
            reps *= 2
    if kind == "fp32" and not np.isfinite(acc).all():
        raise ArithmeticError("the FMA chains did not stay finite")
    return best


@dataclass(frozen=True)
class Peak:
    """The measured peak of ``threads`` threads: float32 GFLOP/s (one FMA: two
    operations) and int8 GOPS (None where not measured: ``note`` says why)."""

    threads: int
    fp32_gflops: float
    int8_gops: float | None
    note: str = ""


def _steady(kind: str, n: int, seconds: float) -> tuple[float, bool]:
    """``kind``'s rate on ``n`` threads, and whether other processes held the cores:
    ``n`` threads slower than one (tried up to three times)."""
    if n == 1:
        return _rate(kind, 1, seconds), False
    single = _rate(kind, 1, seconds)
    for _ in range(3):
        rate = _rate(kind, n, seconds)
        if rate >= single:
            return rate, False
    return max(rate, single), True


def measure(n: int, seconds: float = SECONDS) -> Peak:
    """Measure the peak of ``n`` threads now (numba's threads set to ``n`` meanwhile)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int (threads), got {n!r}")
    notes = []
    with config.override(threads=n):
        fp32, busy = _steady("fp32", n, seconds)
        int8 = None
        if _host.HAS_VNNI:
            int8, busy_int8 = _steady("vnni", n, seconds)
            busy |= busy_int8
        else:
            notes.append(f"int8 not measured: no AVX-512 VNNI at instruction set {_host.ISA!r}")
    if busy:
        notes.append(f"{BUSY}: {n} threads ran no faster than one")
    return Peak(n, fp32 / 1e9, None if int8 is None else int8 / 1e9, "; ".join(notes))


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``) and LLVM's name for it."""
    model = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                    break
    from llvmlite import binding

    return f"{model or platform.processor() or 'unknown'} ({binding.get_host_cpu_name()})"


def cache_key(n: int) -> str:
    """What a cached peak is valid for: CPU, instruction-set level, threads, version."""
    return f"{cpu_name()} | {_host.ISA} | {n} threads | convengine {__version__}"


def _load(path: Path) -> dict[str, Any]:
    """The cached entries, {} if the file is missing, unreadable or corrupt."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _valid(entry: Any, n: int) -> bool:
    if not isinstance(entry, dict) or entry.get("threads") != n:
        return False
    fp32, int8 = entry.get("fp32_gflops"), entry.get("int8_gops")
    return (isinstance(fp32, float) and fp32 > 0
            and (int8 is None or (isinstance(int8, float) and int8 > 0))
            and isinstance(entry.get("note"), str))


def _save(path: Path, entries: dict[str, Any]) -> None:
    """Write ``entries`` whole (a temporary file renamed into place); quietly nothing
    where the directory cannot be written (the peak is measured again next time)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".peak.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entries, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def peak(n: int | None = None, refresh: bool = False) -> Peak:
    """The peak of ``n`` threads (default: ``config.get("threads")``), from
    ``<cache dir>/peak.json`` if measured there before on this CPU, ISA and version,
    else measured now and stored (``refresh``: measured again regardless; a peak
    measured while other processes held the cores is not stored)."""
    n = config.get("threads") if n is None else n
    path = config.cache_dir() / FILE
    key = cache_key(n)
    entries = _load(path)
    if not refresh and _valid(entries.get(key), n):
        return Peak(**entries[key])
    found = measure(n)
    if BUSY not in found.note:
        entries = {k: v for k, v in _load(path).items() if isinstance(v, dict)}
        entries[key] = asdict(found)
        _save(path, entries)
    return found
