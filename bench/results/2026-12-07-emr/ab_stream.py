"""Streaming-store threshold A/B: alternating fresh processes, an ONNX session each.

    python ab_stream.py export                      # ResNet-50, MobileNetV2 to /tmp/abm
    python ab_stream.py MODEL BATCH default,8 ROUNDS  # 8: STREAMING_BYTES = 8 MiB
"""

import json
import os
import statistics
import subprocess
import sys
import time


def child(model: str, batch: int, stream_mib: str) -> None:
    import numpy as np

    import convengine as ce
    import convengine.algorithms.blocked.forward as blocked
    import convengine.algorithms.depthwise.forward as depthwise
    import convengine.onnx as ceo

    if stream_mib != "default":
        blocked.STREAMING_BYTES = depthwise.STREAMING_BYTES = int(float(stream_mib) * (1 << 20))
    ce.config.set(threads=2)
    x = np.random.default_rng(1).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    session = ceo.Session(f"/tmp/abm/{model}.onnx")
    for _ in range(3):
        session.run(None, {"input": x})
    times = []
    for _ in range(12):
        start = time.perf_counter()
        session.run(None, {"input": x})
        times.append(time.perf_counter() - start)
    print(json.dumps({"median_ms": 1e3 * statistics.median(times)}))


def main() -> None:
    if sys.argv[1] == "child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    if sys.argv[1] == "export":
        from convengine.bench.peers import _export_child

        for model in ("resnet50", "mobilenet_v2"):
            os.makedirs(f"/tmp/abm/{model}", exist_ok=True)
            _export_child(model, 1.0, 224, f"/tmp/abm/{model}")
            os.replace(f"/tmp/abm/{model}/fp32.onnx", f"/tmp/abm/{model}.onnx")
        return
    model, batch, variants, rounds = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
    found: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            out = subprocess.run([sys.executable, __file__, "child", model, batch, v],
                                 capture_output=True, text=True, check=True)
            found[v].append(json.loads(out.stdout.strip().splitlines()[-1])["median_ms"])
    for v, ms in found.items():
        print(f"{model} {batch} {v} median {statistics.median(ms):.1f} ms "
              f"range {min(ms):.1f}-{max(ms):.1f}")


if __name__ == "__main__":
    main()
