"""Block sizes: ``triton.autotune`` over configurations on a GPU, keyed on the GEMM
sizes rounded up to powers of two, pruned to what fits the device's shared memory, the
choices kept in convengine's tuning cache under the device's name (:mod:`.records`);
under ``TRITON_INTERPRET=1`` one small fixed configuration (every block a power of
two, ``tl.dot`` operands at least 16 x 16, 32 deep for int8, as real GPUs need).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
import triton

from ..problem import ConvProblem
from . import kernels, records

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_DEFAULT_SMEM = 99 * 1024  # sm_86/sm_89 opt-in limit; sm_80/sm_90 allow more


def bucket(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _gemm_configs(int8: bool) -> list[triton.Config]:
    shapes = [(128, 128, 64, 8, 3), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
              (64, 128, 32, 4, 4), (64, 64, 32, 4, 4), (128, 256, 32, 8, 3),
              (256, 128, 32, 8, 3), (64, 64, 64, 4, 3)]
    if int8:  # int8 mma is 32 deep: keep BLOCK_K a multiple of 64
        shapes = [(bm, bn, max(bk * 2, 64), w, s) for bm, bn, bk, w, s in shapes]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                          num_warps=w, num_stages=s) for bm, bn, bk, w, s in shapes]


def _shared_memory_limit(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", _DEFAULT_SMEM))


def _footprint(c: triton.Config, itemsize: int) -> int:
    """Shared-memory bytes of a configuration's pipelined A and B tiles."""
    return c.num_stages * (c.kwargs["BLOCK_M"] + c.kwargs["BLOCK_N"]) * c.kwargs["BLOCK_K"] * itemsize


def fitting(configs: list[triton.Config], itemsize: int, limit: int) -> list[triton.Config]:
    """The configurations that fit ``limit`` bytes of shared memory (if none does, the
    smallest)."""
    fits = [c for c in configs if _footprint(c, itemsize) <= limit]
    return fits or [min(configs, key=lambda c: _footprint(c, itemsize))]


def _prune(configs: list[triton.Config], named_args: dict[str, Any],
           **kwargs: Any) -> list[triton.Config]:
    a = named_args["a_ptr"]
    return fitting(configs, a.element_size(), _shared_memory_limit(a.device))


@functools.cache
def _autotuned(kernel: str, int8: bool) -> Any:
    keys = ["M_BUCKET", "Q_BUCKET", "K_BUCKET", "ACT"] + (["EPI"] if kernel == "igemm" else [])
    configs = _gemm_configs(int8)
    if kernel != "igemm":  # no grouped program order there
        configs = [triton.Config({k: v for k, v in c.kwargs.items() if k != "GROUP_M"},
                                 num_warps=c.num_warps, num_stages=c.num_stages)
                   for c in configs]
    return triton.autotune(configs=configs, key=keys,
                           prune_configs_by={"early_config_prune": _prune},
                           )(getattr(kernels, f"{kernel}_kernel"))


_RECORDED: set[Any] = set()  # decisions recorded by this process


def _device_name(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} sm_{major}{minor}"


def _through_cache(kernel: str, int8: bool, grid: Callable[..., Any],
                   buckets: tuple[int, ...], problem: ConvProblem) -> Callable[..., None]:
    """A launcher that runs the configuration the tuning cache records for this kernel,
    size bucket, constexprs and dtypes on this device, else the autotuner (recording its
    choice)."""
    def run(*args: Any, **kw: Any) -> None:
        tuner = _autotuned(kernel, int8)
        key = (*buckets, *(f"{k}={kw[k]}" for k in sorted(kw) if k.isupper()),
               *(str(a.dtype) for a in args if hasattr(a, "dtype")))
        which = records.ident(kernel, key, _device_name(args[0].device), tuner.configs)
        config = records.recorded(which)
        if config is not None:
            getattr(kernels, f"{kernel}_kernel")[grid](*args, *buckets, **kw,
                                                       **config.all_kwargs())
            return
        tuner[grid](*args, *buckets, **kw)
        if which not in _RECORDED:  # the autotuner benchmarked this key just now
            _RECORDED.add(which)
            records.record(which, problem.pass_, problem.describe(), tuner.configs_timings)
    return run


def igemm(m: int, q: int, k: int, int8: bool, problem: ConvProblem) -> Callable[..., None]:
    """A launcher ``fn(*args, **constexprs)`` of the implicit GEMM for an ``m x q``
    GEMM with reduction ``k``; it appends the size buckets and picks the grid."""
    buckets = (bucket(m), bucket(q), bucket(k))

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(q, meta["BLOCK_N"]),)

    if INTERPRET:
        fixed = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32 if int8 else 16, "GROUP_M": 8}

        def run_fixed(*args: Any, **kw: Any) -> None:
            kernels.igemm_kernel[grid](*args, *buckets, **kw, **fixed)
        return run_fixed

    return _through_cache("igemm", int8, grid, buckets, problem)


def dgrad_phased(m: int, phases: int, q: int, k: int,
                 problem: ConvProblem) -> Callable[..., None]:
    """A launcher of the phased backward-data kernel: ``m`` rows in the largest phase."""
    buckets = (bucket(m), bucket(q), bucket(k))

    def grid(meta: dict[str, Any]) -> tuple[int, int, int]:
        return (triton.cdiv(m, meta["BLOCK_M"]), phases, triton.cdiv(q, meta["BLOCK_N"]))

    if INTERPRET:
        def run_fixed(*args: Any, **kw: Any) -> None:
            kernels.dgrad_phased_kernel[grid](*args, *buckets, **kw, BLOCK_M=32, BLOCK_N=32,
                                              BLOCK_K=16)
        return run_fixed

    return _through_cache("dgrad_phased", False, grid, buckets, problem)


def direct_blocks(q: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the direct kernel for ``q`` output channels."""
    return (32 if INTERPRET else 64), min(64, max(16, bucket(q)))


def wgrad_blocks(o: int, c: int) -> tuple[int, int, int]:
    """(BLOCK_M over O, BLOCK_N over C, BLOCK_K over positions) of backward-weight."""
    if INTERPRET:
        return 32, 32, 32
    return min(128, max(16, bucket(o))), min(128, max(16, bucket(c))), 32


def _multiprocessors() -> int:
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)


def wgrad_split(programs: int, positions: int, block_k: int) -> int:
    """Into how many runs backward-weight splits its ``positions`` (the GEMM's long
    reduction) so that ``programs`` x split fill the GPU about four times over, each
    run at least 8 blocks long; under the interpreter 2 where there is room, so that
    the tests cover the partial sums."""
    blocks = triton.cdiv(positions, block_k)
    if INTERPRET:
        return 2 if blocks >= 2 else 1
    want = triton.cdiv(4 * _multiprocessors(), programs)
    return max(1, min(want, blocks // 8, 64))


def wgrad_direct_blocks(n: int) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_N) of the grouped backward-weight over ``n`` (o, r) pairs."""
    return (32 if INTERPRET else 64), min(64, max(16, bucket(n)))
