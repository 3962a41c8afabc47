"""One activation / epilogue code, one meaning, on CPU and GPU: the kernels that take a
code compute the function its name says (checked against numpy by name), and the GPU
side's codes, where triton imports, are the same integers."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from convengine import fused_epilogue
from convengine.algorithms.blocked import forward as blocked
from convengine.epilogue_codes import CPU_STORE, FUSED, GPU, Activation, Epilogue

BY_NAME = {  # float64 reference of each name
    "none": lambda v: v,
    "relu": lambda v: np.maximum(v, 0),
    "relu6": lambda v: np.clip(v, 0, 6),
    "silu": lambda v: v / (1 + np.exp(-v)),
}


def test_codes_are_distinct_and_named() -> None:
    assert len({int(a) for a in Activation}) == len(Activation)
    assert len({int(e) for e in Epilogue}) == len(Epilogue)
    for a in Activation:
        assert Activation.of(a.label) is a
    assert Activation.of(None) is Activation.NONE
    with pytest.raises(ValueError, match=r"activation must be one of \('none', 'relu', 'relu6'\)"):
        Activation.of("silu", CPU_STORE)


def test_cpu_name_lists_follow_the_codes() -> None:
    assert fused_epilogue.ACTIVATIONS == tuple(a.label for a in FUSED)
    assert blocked.EPILOGUE_ACTIVATIONS == tuple(a.label for a in CPU_STORE)
    # callers index the name lists: the index must be the code
    for names in (fused_epilogue.ACTIVATIONS, blocked.EPILOGUE_ACTIVATIONS):
        assert [Activation.of(n) for n in names] == list(range(len(names)))


@pytest.mark.parametrize("code", FUSED, ids=lambda a: a.label)
def test_fused_kernel_computes_the_named_function(code: Activation) -> None:
    rng = np.random.default_rng(int(code))
    y = (rng.standard_normal((5, 16)) * 8).astype(np.float32)
    want = BY_NAME[code.label](y.astype(np.float64))
    fused_epilogue._epilogue(y, np.zeros(16, np.float32), y, False, int(code))
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def _gpu_modules():
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("triton or torch is not installed")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from convengine.gpu import algorithms, kernels

    return algorithms, kernels


def test_gpu_codes_are_the_cpu_codes() -> None:
    algorithms, kernels = _gpu_modules()
    for a in GPU:
        name = None if a is Activation.NONE else a.label
        assert algorithms.activation_code(name) == int(a)
    shared = set(CPU_STORE) & set(GPU)
    assert {Activation.NONE, Activation.RELU} <= shared
    for a in shared:  # a code both take means one function on both
        assert algorithms.activation_code(None if a is Activation.NONE else a.label) == \
            int(Activation.of(a.label, CPU_STORE))
    constexprs = {"RELU": Activation.RELU, "SILU": Activation.SILU, "GELU": Activation.GELU,
                  "FLOAT": Epilogue.FLOAT, "REQUANT_FLOAT": Epilogue.REQUANT_FLOAT,
                  "REQUANT_INT32": Epilogue.REQUANT_INT32}
    for attr, code in constexprs.items():
        assert getattr(kernels, attr).value == int(code), attr
    with pytest.raises(ValueError, match="activation"):
        algorithms.activation_code("relu6")  # not a GPU epilogue
