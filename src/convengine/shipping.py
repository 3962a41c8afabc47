"""Shipped kernels, the build side: compile model suites' kernels for portable targets
(``_targets``) into the folder a built wheel carries, so that a new install loads
machine code instead of compiling it (``convengine build-cache``).

Each target is built by ``convengine warmup`` (``--tune=algorithms``: every candidate
algorithm at its default parameters, which a first call in the default tuning mode
runs), and optionally one run of ONNX
models through ``convengine.onnx.Session`` (``--onnx``), in processes of their own compiling
for the target (``CONVENGINE_TARGET``) into a new kernel directory; a manifest
(``TARGET.json``: the target, the versions of Python, convengine, numba and llvmlite,
each file's sha256) is written beside the kernels, and the folder replaces
``<out>/<target>`` whole. The host must run the target's code (an AVX-512 host builds
every target; an AVX2 host only ``x86-64-v3``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from . import _kernel_cache, _targets

# what a process compiling for a target must not inherit (they choose a target too,
# or point at other kernels)
_CLEARED = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "CONVENGINE_ISA", "CONVENGINE_CHECKED",
            "CONVENGINE_KERNEL_DIR", "CONVENGINE_CACHE_DIR", "NUMBA_CACHE_DIR",
            _targets.SHIPPED_ENV, _targets.SHIPPED_DIR_ENV, _targets.TARGET_ENV)


class Built(NamedTuple):
    """One target built: where, how many files and bytes, the seconds it took."""

    target: str
    folder: Path
    files: int
    bytes: int
    seconds: float


def check_target(name: str, flags: frozenset[str] | None = None) -> _targets.Target:
    """The target ``name``; ValueError if unknown or if this CPU (``flags``: another's)
    cannot run its code, which building it runs."""
    return _targets.lookup(name, _targets.cpu_flags() if flags is None else flags, "target")


# runs each ONNX model of argv once through a session, on random inputs of its shape
# (a dimension without a size: 1)
_ONNX_RUN = """
import sys
import numpy as np
from convengine.onnx import Session
rng = np.random.default_rng(0)
for path in sys.argv[1:]:
    session = Session(path)
    feed = {i.name: rng.standard_normal([d if isinstance(d, int) and d > 0 else 1
                                         for d in i.shape]).astype(i.dtype or np.float32)
            for i in session.get_inputs()}
    session.run(None, feed)
"""


def check_models(paths: Sequence[Path]) -> list[Path]:
    """``paths`` as files; ValueError naming the first that is not one."""
    for path in paths:
        if not Path(path).is_file():
            raise ValueError(f"onnx: {path} is not a file")
    return [Path(p).resolve() for p in paths]


def _run(command: list[str], env: dict[str, str], name: str) -> None:
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"compiling for {name} failed ({' '.join(command[1:])[:200]}):\n"
                           f"{proc.stderr[-3000:]}")


def build(name: str, out: Path, warmup_args: Sequence[str],
          onnx_models: Sequence[Path] = ()) -> Built:
    """Compile ``convengine warmup <warmup_args>``, then one session run of each ONNX
    model of ``onnx_models`` (extra onnx), for target ``name`` into ``<out>/<name>``
    (replacing what is there)."""
    target = check_target(name)
    models = check_models(onnx_models)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f".build-{name}-", dir=out) as stage:
        env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
        env.update({_targets.TARGET_ENV: name,
                    "CONVENGINE_KERNEL_DIR": str(Path(stage, "kernels")),
                    "CONVENGINE_CACHE_DIR": str(Path(stage, "cache")),
                    _targets.SHIPPED_DIR_ENV: str(Path(stage, "none"))})
        _run([sys.executable, "-m", "convengine.cli", "warmup", *warmup_args], env, name)
        if models:
            _run([sys.executable, "-c", _ONNX_RUN, *map(str, models)], env, name)
        built = Path(stage, "kernels", target.name)
        manifest = _kernel_cache.shipped_manifest(target.name, built)
        (built / _targets.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        folder = out / name
        old = Path(stage, "old")
        if folder.exists():
            folder.rename(old)
        built.rename(folder)
    files = manifest["files"]
    size = sum((folder / f).stat().st_size for f in files)
    return Built(name, folder, len(files), size, time.perf_counter() - start)
