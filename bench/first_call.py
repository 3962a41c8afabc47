"""How long a new process takes to its first answers: ``import convengine``, then one
pass over every conv of ResNet-50 and of MobileNetV2 (batch 1, NCHW float32, default
tuning mode), each conv called once; what numba compiled meanwhile (count, seconds).

Run it with empty caches to see a new user's first minute (``--fresh`` points every
cache at a new temporary directory), or as is to see a warm start. Each measurement
runs in a process of its own; prints one JSON object per line.

    python bench/first_call.py --fresh [--suites resnet50,mobilenet_v2] [--threads 2]
    python bench/first_call.py --fresh --onnx resnet50.onnx,mobilenet_v2.onnx
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
start = time.perf_counter()
import convengine as ce
import numpy as np
ce.set_num_threads(THREADS)
imported = time.perf_counter() - start
from numba.core import event

class Count(event.Listener):
    def __init__(self):
        self.n, self.seconds, self._starts, self.kernels = 0, 0.0, [], {}
    def on_start(self, ev):
        self._starts.append(time.perf_counter())
    def on_end(self, ev):
        t = self._starts.pop()
        if not self._starts:  # outermost compilations only
            self.n += 1
            self.seconds += time.perf_counter() - t
            fn = getattr((ev.data or {}).get("dispatcher"), "py_func", None)
            tag = getattr(fn, "__globals__", {}).get("__kernel_tag__") or getattr(fn, "__module__", "?")
            name = f"{tag}.{getattr(fn, '__name__', '?')}"
            self.kernels[name] = round(self.kernels.get(name, 0) + time.perf_counter() - t, 2)

from convengine.bench import suites
import os
out = {"import_s": round(imported, 3), "llvm_cpu": os.environ.get("NUMBA_CPU_NAME")}
rng = np.random.default_rng(0)
for name in SUITES:
    counter = Count()
    event.register("numba:compile", counter)
    t0 = time.perf_counter()
    for layer in suites.suite(name, batch=1):
        x = rng.standard_normal(layer.x, dtype=np.float32)
        w = rng.standard_normal(layer.w, dtype=np.float32)
        ce.conv(x, w, **layer.conv_args())
    out[name] = {"first_pass_s": round(time.perf_counter() - t0, 3),
                 "compiled": counter.n, "compile_s": round(counter.seconds, 2),
                 "kernels": counter.kernels}
    event.unregister("numba:compile", counter)
out["total_s"] = round(time.perf_counter() - start, 3)
print(json.dumps(out))
"""


SESSION = r"""
import json, sys, time
start = time.perf_counter()
import numpy as np
ENGINE
rng = np.random.default_rng(0)
path = sys.argv[1]
session = open_session(path)
feed = {i.name: rng.standard_normal([d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
                                    ).astype(np.float32) for i in session.get_inputs()}
opened = time.perf_counter() - start
t0 = time.perf_counter()
session.run(None, feed)
first = time.perf_counter() - t0
t0 = time.perf_counter()
session.run(None, feed)
print(json.dumps({"model": path, "engine": NAME, "open_s": round(opened, 3),
                  "first_run_s": round(first, 3), "second_run_s": round(time.perf_counter() - t0, 3),
                  "total_s": round(opened + first, 3)}))
"""
ENGINES = {
    "convengine": "import convengine as ce\nce.set_num_threads(THREADS)\n"
                  "from convengine.onnx import Session as open_session",
    "onnxruntime": "import onnxruntime as ort\n"
                   "def open_session(path):\n"
                   "    o = ort.SessionOptions(); o.intra_op_num_threads = THREADS\n"
                   "    return ort.InferenceSession(path, o, providers=['CPUExecutionProvider'])",
}


def _child(code: str, env: dict[str, str], *argv: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code, *argv], env=env, text=True,
                          capture_output=True, check=False)
    if proc.returncode:
        sys.exit(proc.stderr)
    return proc.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default="resnet50,mobilenet_v2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fresh", action="store_true",
                        help="empty caches: tuning, kernels and numba's, in a new directory")
    parser.add_argument("--onnx", help="comma-separated ONNX files: time a new process's "
                                       "session and first run instead, convengine and ONNX "
                                       "Runtime each in its own process")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.fresh:
        home = tempfile.mkdtemp(prefix="convengine-first-call-")
        env.update(CONVENGINE_CACHE_DIR=os.path.join(home, "cache"),
                   NUMBA_CACHE_DIR=os.path.join(home, "numba"))
        env.pop("CONVENGINE_KERNEL_DIR", None)
    if args.onnx:
        for path in args.onnx.split(","):
            for name, engine in ENGINES.items():
                code = SESSION.replace("ENGINE", engine).replace("NAME", repr(name))
                print(_child(code.replace("THREADS", str(args.threads)), env, path))
        return
    code = CHILD.replace("THREADS", str(args.threads)).replace(
        "SUITES", repr(args.suites.split(",")))
    print(_child(code, env))


if __name__ == "__main__":
    main()
