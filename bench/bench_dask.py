"""Out-of-core 3-D convolution with convengine.dask, and its cost against one array.

1. Out of core: a float32 volume ``(1, 1, S, S, S)`` of ``--size-gib`` GiB (4 by
   default) is written to a raw file in ``--dir``, read back in ``--chunk``^3 chunks
   (each read into its own buffer, the file mapped only while a chunk is copied),
   convolved by ``convengine.dask.conv`` (3x3x3, ``padding="same"``) on dask's
   threaded scheduler and stored chunk by chunk into a second raw file. Reported:
   voxels per second and the process's peak resident memory (``ru_maxrss``) against
   the volume's size; a few output voxels are checked against the float64 reference
   computed on their neighbourhood.
2. In memory: a ``--small`` ^3 volume, the one-array ``convengine.conv`` against
   ``convengine.dask.conv`` on the same array, best of ``--rounds``.

Tuning is off (the heuristic chooses), so that every block of a different edge
shape is not tuned anew. Needs the ``dask`` extra.

    python bench/bench_dask.py --size-gib 4 --chunk 256 --dir /tmp --json bench/results/dask.json
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("CONVENGINE_TUNING", "off")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import dask  # noqa: E402
import dask.array as da  # noqa: E402
import numpy as np  # noqa: E402

import convengine as ce  # noqa: E402
import convengine.dask as ced  # noqa: E402

GIB = 1 << 30


class RawVolume:
    """A C-ordered float32 array in a raw file; reads and writes copy one region,
    the file mapped only meanwhile (so mapped pages do not pile up in RSS)."""

    def __init__(self, path: Path, shape: tuple[int, ...], create: bool = False) -> None:
        self.path, self.shape, self.dtype, self.ndim = path, shape, np.dtype(np.float32), len(shape)
        if create:
            with open(path, "wb") as f:
                f.truncate(int(np.prod(shape)) * 4)

    def _map(self, mode: str) -> np.memmap:
        return np.memmap(self.path, dtype=self.dtype, mode=mode, shape=self.shape)

    def __getitem__(self, index):
        mm = self._map("r")
        out = np.array(mm[index])
        del mm
        return out

    def __setitem__(self, index, value) -> None:
        mm = self._map("r+")
        mm[index] = value
        mm.flush()
        del mm


def fill(vol: RawVolume, rng: np.random.Generator) -> None:
    """Random values, one plane block at a time (a 64 MiB random tile, shifted)."""
    side = vol.shape[-1]
    tile = rng.standard_normal(16 << 20).astype(np.float32)
    planes = max(1, (64 << 20) // (4 * side * side))
    for z in range(0, vol.shape[2], planes):
        n = min(planes, vol.shape[2] - z) * side * side
        block = np.resize(np.roll(tile, z), n).reshape(1, 1, -1, side, side)
        vol[:, :, z:z + block.shape[2]] = block


def out_of_core(args, w: np.ndarray) -> dict:
    side = round((args.size_gib * GIB / 4) ** (1 / 3))
    shape = (1, 1, side, side, side)
    workdir = Path(tempfile.mkdtemp(prefix="convengine-dask-", dir=args.dir))
    src, dst = RawVolume(workdir / "x.raw", shape, True), RawVolume(workdir / "y.raw", shape, True)
    try:
        start = time.perf_counter()
        fill(src, np.random.default_rng(0))
        write_s = time.perf_counter() - start
        x = da.from_array(src, chunks=(1, 1, args.chunk, args.chunk, args.chunk), asarray=False,
                          name=f"raw-{src.path}")
        y = ced.conv(x, w, padding="same")
        ce.conv(np.zeros((1, 1, 64, 64, 64), np.float32), w, padding="same")  # compile first
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        start = time.perf_counter()
        da.store(y, dst, lock=False, scheduler="threads", num_workers=args.workers)
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        err = check(src, dst, w, side)
    finally:
        if not args.keep:
            for f in (src.path, dst.path):
                f.unlink(missing_ok=True)
            workdir.rmdir()
    return {"shape": shape, "volume_bytes": int(np.prod(shape)) * 4, "chunk": args.chunk,
            "blocks": int(np.prod(y.numblocks)), "write_seconds": write_s,
            "seconds": seconds, "voxels_per_s": np.prod(shape) / seconds,
            "peak_rss_bytes": peak, "rss_before_bytes": before,
            "max_rel_error_vs_float64": err}


def check(src: RawVolume, dst: RawVolume, w: np.ndarray, side: int) -> float:
    """Relative error of a few 8^3 output regions (chunk corners and edges) against
    the float64 reference on their neighbourhood (zero outside the volume)."""
    errs = []
    for corner in (0, side // 2 - 4, side - 8):
        lo, hi = max(corner - 1, 0), min(corner + 9, side)
        region = src[:, :, lo:hi, lo:hi, lo:hi].astype(np.float64)
        pads = [(1 - (corner - lo), 1 - (hi - corner - 8))] * 3
        ref = ce.conv(region, w.astype(np.float64), padding=pads, algo="reference")
        got = dst[:, :, corner:corner + 8, corner:corner + 8, corner:corner + 8]
        errs.append(float(np.abs(got - ref).max() / max(1.0, np.abs(ref).max())))
    return max(errs)


def in_memory(args, w: np.ndarray) -> dict:
    side = args.small
    x = np.random.default_rng(1).standard_normal((1, 1, side, side, side)).astype(np.float32)
    xd = da.from_array(x, chunks=(1, 1, args.chunk // 2, args.chunk // 2, args.chunk // 2))
    times: dict[str, list[float]] = {"one_array": [], "dask": []}
    ce.conv(x, w, padding="same")
    ced.conv(xd, w, padding="same").compute(scheduler="threads", num_workers=args.workers)
    for _ in range(args.rounds):
        start = time.perf_counter()
        ce.conv(x, w, padding="same")
        times["one_array"].append(time.perf_counter() - start)
        start = time.perf_counter()
        ced.conv(xd, w, padding="same").compute(scheduler="threads", num_workers=args.workers)
        times["dask"].append(time.perf_counter() - start)
    best = {k: min(v) for k, v in times.items()}
    return {"shape": x.shape, "chunk": args.chunk // 2, "seconds": best,
            "voxels_per_s": {k: x.size / v for k, v in best.items()},
            "dask_over_one_array_time": best["dask"] / best["one_array"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gib", type=float, default=4.0)
    ap.add_argument("--chunk", type=int, default=256, help="chunk side, voxels (default 256)")
    ap.add_argument("--small", type=int, default=320, help="in-memory volume side (default 320)")
    ap.add_argument("--workers", type=int, default=2, help="dask threads (default 2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the raw files go (default: $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the raw files")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    ce.set_num_threads(args.workers)
    with dask.config.set(num_workers=args.workers):
        w = np.random.default_rng(2).standard_normal((1, 1, 3, 3, 3)).astype(np.float32) / 27
        # out of core first: ru_maxrss is the peak of the whole process so far
        result = {"threads_per_task": ced.default_threads(), "out_of_core": out_of_core(args, w),
                  "in_memory": in_memory(args, w)}
    result["cores"] = os.cpu_count()
    print(json.dumps(result, indent=2, default=lambda v: v.tolist() if hasattr(v, "tolist")
                     else int(v)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=lambda v: int(v)
                                              if not hasattr(v, "tolist") else v.tolist()))


if __name__ == "__main__":
    main()
