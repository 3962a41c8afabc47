"""One fresh process: an ONNX session's steady time with blocked's by_block from a rule."""
import sys, time, statistics, math
import numpy as np
import convengine as ce
from convengine.algorithms.blocked import forward as F
mode, path, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
ratio = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
ce.set_num_threads(2)
orig = F._binding
picked = []
def binding(problem, nr, walk, weight_bytes, bias, params):
    if mode == "rule" and not (params or {}).get("by_block") is not None:
        inside = weight_bytes <= F.BLOCKS_INSIDE_BYTES
        blocks = -(-problem.out_channels // nr)
        x_bytes = 4 * math.prod(problem.x_shape("NHWC"))
        if not inside and blocks >= 2 and weight_bytes > ratio * x_bytes:
            params = dict(params or {}, by_block=1); picked.append(1)
    return orig(problem, nr, walk, weight_bytes, bias, params)
F._binding = binding
from convengine.onnx import Session
s = Session(path)
x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
feed = {s.get_inputs()[0].name: x}
for _ in range(10): s.run(None, feed)
ts = []
t_end = time.perf_counter() + 6
while time.perf_counter() < t_end:
    t = time.perf_counter(); s.run(None, feed); ts.append(time.perf_counter() - t)
print(f"{mode} {path.split('/')[-1]} b{batch} picked {len(picked)} median {statistics.median(ts)*1e3:.2f} ms n {len(ts)}")
