"""The pieces of a remembered ``convengine.conv`` call on a tiny layer (16 channels,
2x2 pixels), each timed alone: best of 5 repeats of 20,000 calls (microseconds)."""

from __future__ import annotations

import timeit

import numpy as np

import convengine as ce
from convengine import api, devices, nan_rule, select
from convengine.algorithms.blocked import forward as blocked
from convengine.algorithms.weight_cache import same_bits
from convengine.problem import as_array


def main() -> None:
    ce.set_num_threads(2)
    ce.set_tuning("off")
    x = np.ones((1, 2, 2, 16), np.float32)
    w = np.ones((16, 1, 1, 16), np.float32)
    w_copy = w.copy()
    ce.conv(x, w, layout="NHWC")
    key = api._call_key("forward", x, w, True, 1, 0, 1, 1, "NHWC", "auto")
    problem, chosen, run = api._resolve_call(key, lambda: None, "auto")
    out = run(x, w)
    kind = ("forward", 2, 16)
    pieces = {
        "conv": lambda: ce.conv(x, w, layout="NHWC"),
        "PreparedConv": lambda: prepared(x),
        "wanted": lambda: devices.wanted("auto", x, w),
        "as_array x2": lambda: (as_array(x, "x"), as_array(w, "w")),
        "call_key": lambda: api._call_key("forward", x, w, True, 1, 0, 1, 1, "NHWC", "auto"),
        "resolve_call": lambda: api._resolve_call(key, lambda: None, "auto"),
        "settings": lambda: select.settings("forward"),
        "execute": lambda: api._execute(problem, chosen, run, x, w, x.dtype, None),
        "run": lambda: run(x, w),
        "PACKED.get": lambda: blocked.PACKED.get(w, kind, lambda w: None),
        "key": lambda: blocked.PACKED._key(w, kind),
        "same_bits": lambda: same_bits(w, w_copy),
        "must_recompute": lambda: nan_rule.must_recompute(problem, chosen, w, out),
    }
    prepared = ce.PreparedConv(w, layout="NHWC")
    for name, fn in pieces.items():
        best = min(timeit.repeat(fn, number=20000, repeat=5)) / 20000
        print(f"{name:16s} {best * 1e6:6.2f} us")


if __name__ == "__main__":
    main()
