"""numba's start-up floor: a new process imports numpy and numba and calls one cached
``@njit`` function (run it twice: the first run compiles and caches). Lab script.

    python numba_floor.py
"""

import importlib
import time


def main() -> None:
    t0 = time.perf_counter()
    np = importlib.import_module("numpy")
    t1 = time.perf_counter()
    numba = importlib.import_module("numba")
    t2 = time.perf_counter()

    @numba.njit(cache=True)
    def total(x):  # type: ignore[no-untyped-def]
        return x.sum()

    total(np.ones(3))
    t3 = time.perf_counter()
    print(f"numpy {t1 - t0:.3f} numba import {t2 - t1:.3f} first cached call {t3 - t2:.3f} "
          f"total {t3 - t0:.3f}")


if __name__ == "__main__":
    main()
