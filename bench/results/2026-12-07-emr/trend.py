"""Each tuned parameter value against its algorithm's default over a tuning run:
python trend.py tune-resnet50-b8.json (the JSON of ``convengine tune --json``)."""

import json
import statistics
import sys
from collections import defaultdict

runs: dict[tuple[str, str], list[float]] = defaultdict(list)
with open(sys.argv[1]) as f:
    entries = json.load(f)["entries"]
for entry in entries:
    results = entry["results"]
    base = entry["choice"].split("[")[0]
    if base not in results or results[base].get("eliminated"):
        continue
    default = results[base]["median_s"]
    for label, result in results.items():
        if label.startswith(base + "[") and not result.get("eliminated") \
                and result.get("median_s"):
            runs[(entry["key"].split()[0], label[len(base):])].append(
                default / result["median_s"])
for (pass_, label), speed in sorted(runs.items()):
    print(f"{pass_:<16} {label:<22} n={len(speed):3d} geomean "
          f"{statistics.geometric_mean(speed):.3f} min {min(speed):.2f} max {max(speed):.2f}")
