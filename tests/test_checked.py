"""Checked mode (CONVENGINE_CHECKED=1): a kernel call reaching outside its buffers is
skipped and raises BoundsError naming the kernel, the buffer and the range; the memory
pool's guards catch a write past a pooled array; off, the checks are compiled out.
Each case runs in a fresh process (the mode is fixed at import)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import convengine as ce
from convengine import checked
from convengine.errors import ConvSetupError


def _run(code: str, mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, checked.CHECKED_ENV: mode}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)


# a gather-driver call whose 5x5 output needs a 7x7 input but gets a 6x6 one: the last
# tiles' input rows run past x (y itself is whole)
OVERREACH = """
    import numpy as np
    from convengine.algorithms.blocked import forward
    nvec = forward.NVECS[-1]
    nr = forward.VEC * nvec
    xp = np.ones((1, 6, 6, 8), np.float32)
    wp = np.ones((1, 3, 3, 8, nr), np.float32)
    y = np.full((1, 5, 5, nr), -7.0, np.float32)
    bias = np.zeros(nr, np.float32)
    run = forward._gather_driver(nvec)
    try:
        run(xp, wp.reshape(-1), y, bias, y, False, 0, 1, 1, 1, 1, 1, True,
            *forward.packed_walk(wp, 1))
    except IndexError as exc:
        print(type(exc).__name__, "|", exc, "|", int((y == -7.0).all(axis=-1).sum()))
    else:
        print("no error")
"""


@pytest.mark.slow
def test_a_call_outside_its_buffer_raises_naming_kernel_buffer_and_range() -> None:
    res = _run(OVERREACH, "1")
    assert res.returncode == 0, res.stderr[-3000:]
    kind, message, untouched = res.stdout.strip().splitlines()[-1].split(" | ")
    assert kind == "BoundsError"
    assert "blocked gather kernel" in message and "would access x[" in message
    assert "outside its 288 elements" in message  # 6 * 6 * 8
    assert int(untouched) >= 1  # the offending tile was skipped, not run


def test_bounds_error_message_and_type() -> None:
    exc = checked.BoundsError("k", "y", 10, 20, 15)
    assert isinstance(exc, IndexError)
    assert str(exc) == "convengine checked mode: k would access y[10:20], outside its 15 elements"


def test_the_setting_is_read_at_import_and_refused_at_run_time() -> None:
    assert ce.config.get("checked") is checked.CHECKED
    with pytest.raises(ConvSetupError, match=r"checked is fixed at import: set \$CONVENGINE_CHECKED"):
        ce.config.set(checked=True)
    with pytest.raises(ValueError, match="CONVENGINE_CHECKED='maybe'"):
        checked._parse("maybe")


GUARD = """
    import numpy as np
    from convengine import memory
    from convengine.checked import BoundsError
    a = memory.empty(2 << 20, np.uint8)
    # write 3 bytes past the array through its block (as a kernel's stray store would)
    lease = a.base
    while not hasattr(lease, "block"):
        lease = lease.base
    lease.block[lease.end:lease.end + 3] = 0
    del a, lease
    try:
        memory.empty(2 << 20, np.float32)  # the next allocation reports it
    except BoundsError as exc:
        print("caught |", exc)
    memory.check()  # once
    c = memory.empty((2 << 20) // 4, np.float32)  # the freed block, poisoned
    print("poisoned |", bool(np.isnan(c).all()))
"""


@pytest.mark.slow
def test_the_pool_guards_and_poisons_in_checked_mode() -> None:
    res = _run(GUARD, "1")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    caught = [ln for ln in lines if ln.startswith("caught")]
    assert caught and "3 of the 4096 guard bytes" in caught[0], res.stdout
    assert "poisoned | True" in lines, res.stdout


NORMAL = """
    from convengine import checked, memory
    from convengine.algorithms.blocked import forward
    import numpy as np
    run = forward._gather_driver(forward.NVECS[-1])
    nr = forward.VEC * forward.NVECS[-1]
    xp, wp = np.ones((1, 4, 4, 8), np.float32), np.ones((1, 3, 3, 8, nr), np.float32)
    y = np.zeros((1, 2, 2, nr), np.float32)
    run(xp, wp.reshape(-1), y, np.zeros(nr, np.float32), y, False, 0, 1, 1, 1, 1, 1, True,
        *forward.packed_walk(wp, 1))
    ir = "".join(run.inspect_llvm().values())
    print(checked.CHECKED, memory.allocator(2 << 20, np.uint8).args[0], "BoundsError" in ir,
          float(y[0, 0, 0, 0]))
"""


@pytest.mark.slow
def test_off_the_checks_are_compiled_out() -> None:
    res = _run(NORMAL, "0")
    assert res.returncode == 0, res.stderr[-3000:]
    flag, block, in_ir, value = res.stdout.split()[-4:]
    from convengine import memory
    assert (flag, in_ir, value) == ("False", "False", "72.0")  # 3 * 3 * 8 ones
    assert int(block) == memory.size_class((2 << 20) + memory.ALIGN)  # no guard
