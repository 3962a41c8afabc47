"""The A/B table of run_ab.sh's outputs: per row, each pass's ratio against the peer
(ours faster above 1), the mean of the two base passes and of the two head passes,
and head/base (above 1: HEAD is the faster relative to the same peer)."""
import json
import math
import re
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
PASSES = ("base", "head", "head2", "base2")


def onnx_rows(label):
    rows = {}
    path = out / f"bench_onnx.py.{label}.txt"
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 6 and re.fullmatch(r"\d+", cells[2] or ""):
            rows[f"onnx {cells[0]} {cells[1]} b{cells[2]} (ORT)"] = float(cells[5])
    return rows


def json_rows(kind, label):
    path = out / f"{kind}.{label}.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if kind == "models":
        return {f"models {r['model']} {r['mode']} b{r['batch']} {r['format']} (torch)": r["ratio"]
                for r in data["rows"] if r["mode"] != "numpy"}
    return {f"fp32 {k} (torch, geomean)": v for k, v in data["summary"].items()}


table = {label: {**onnx_rows(label), **json_rows("models", label), **json_rows("fp32", label)}
         for label in PASSES}
names = [n for n in table["base"] if all(n in table[p] for p in PASSES)]
print("| row | base | head | head2 | base2 | base mean | head mean | head/base |")
print("|---|---|---|---|---|---|---|---|")
changes = []
for n in names:
    v = [table[p][n] for p in PASSES]
    b, h = math.sqrt(v[0] * v[3]), math.sqrt(v[1] * v[2])
    changes.append(h / b)
    print(f"| {n} | " + " | ".join(f"{x:.2f}" for x in v) + f" | {b:.2f} | {h:.2f} | {h / b:.2f} |")
if changes:
    print(f"\ngeometric mean of head/base over {len(changes)} rows: "
          f"{math.exp(sum(map(math.log, changes)) / len(changes)):.3f}")
