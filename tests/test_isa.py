"""CONVENGINE_ISA: the instruction-set level lowered on one host.

The level's logic (from LLVM's feature flags) is tested on made-up feature dicts; the
AVX2 kernels run in a subprocess started with ``CONVENGINE_ISA=avx2`` (the level is
read once at import): the float kernels with 32-byte vectors against the float64
reference, the int8 path "avx2" bit-exact against an int64 reference of the formula.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import convengine as ce
import convengine.algorithms.blocked.forward  # noqa: F401  (for its fingerprint)
from convengine import _host, qconv
from convengine import _kernel_cache as kc
from oracle import assert_close, random, reference
from test_quant_conv import assert_equal_q, ref_acc, ref_requant

ROOT = Path(__file__).parent.parent
AVX512 = {f: True for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                            "avx512cd", "sse4.2")}
VNNI = {**AVX512, "avx512vnni": True}
AMX = {**VNNI, "amx-int8": True, "amx-tile": True, "amx-bf16": True}
CAN_AVX2 = _host.ISA_LEVELS.index(_host.CPU_ISA) >= _host.ISA_LEVELS.index("avx2")


# ----------------------------------------------------------------- the level's logic


@pytest.mark.parametrize("features,level", [
    ({}, "none"),
    ({"avx2": True}, "none"),  # FMA missing
    ({"avx2": True, "fma": True}, "avx2"),
    ({"avx2": True, "fma": True, "avx512f": True}, "avx2"),  # AVX-512 incomplete
    ({**AVX512, "avx2": False}, "none"),  # a level needs every level below it
    (AVX512, "avx512"),
    ({**AVX512, "amx-int8": True, "amx-tile": True}, "avx512"),  # no VNNI: no AMX
    (VNNI, "avx512_vnni"),
    (AMX, "amx"),
])
def test_cpu_level_from_features(features, level, monkeypatch):
    monkeypatch.setattr(_host, "request_amx", lambda: True)
    assert _host._cpu_level(features) == level


def test_amx_needs_the_kernel_s_permission(monkeypatch):
    monkeypatch.setattr(_host, "request_amx", lambda: False)
    assert _host._cpu_level(AMX) == "avx512_vnni"


def test_chosen_level():
    assert _host._chosen_level("avx512_vnni", "") == "avx512_vnni"
    assert _host._chosen_level("avx512_vnni", " AVX2 ") == "avx2"
    for level in _host.ISA_LEVELS[:4]:
        assert _host._chosen_level("avx512_vnni", level) == level


@pytest.mark.parametrize("cpu,word,match", [
    ("avx512_vnni", "amx", r"CONVENGINE_ISA='amx' is above this CPU's .*'avx512_vnni'.*"
                           r"none, avx2, avx512, avx512_vnni"),
    ("avx2", "avx512", r"CONVENGINE_ISA='avx512' is above .*'avx2'.*none, avx2"),
    ("amx", "sse4", r"CONVENGINE_ISA must be one of none, avx2, avx512, avx512_vnni, amx.*"
                    r"'sse4'"),
    ("amx", "avx-512", r"CONVENGINE_ISA must be one of"),
])
def test_chosen_level_errors_name_the_variable_and_the_values(cpu, word, match):
    with pytest.raises(ValueError, match=match):
        _host._chosen_level(cpu, word)


def test_lowering_drops_the_features_above():
    features = {**AMX, "avx512bf16": True, "avx512vbmi": True}
    assert _host._lowered(features, "amx") == features
    vnni = _host._lowered(features, "avx512_vnni")
    assert not {"amx-int8", "amx-tile"} & set(vnni) and vnni["avx512vnni"]
    avx512 = _host._lowered(features, "avx512")
    assert "avx512vnni" not in avx512 and avx512["avx512f"] and avx512["avx512bf16"]
    avx2 = _host._lowered(features, "avx2")
    assert not [f for f in avx2 if f.startswith(("avx512", "amx"))]
    assert avx2["avx2"] and avx2["fma"] and avx2["sse4.2"]
    assert not [f for f in _host._lowered(features, "none") if f in ("avx2", "fma")]


def test_the_host_s_level_is_consistent():
    assert _host.ISA_LEVELS.index(_host.ISA) <= _host.ISA_LEVELS.index(_host.CPU_ISA)
    assert _host.FEATURES == _host._lowered(_host.CPU_FEATURES, _host.ISA)
    assert _host.VECTOR_BYTES == (64 if _host.HAS_AVX512 else 32)


# ----------------------------------------------------------------- subprocesses


def _python(code: str, isa: str | None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != _host.ISA_ENV}
    if _host.LLVM_TARGET_LOWERED:  # this process lowered numba's target: not for the child
        env.pop("NUMBA_CPU_FEATURES")
    if isa is not None:
        env[_host.ISA_ENV] = isa
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_the_llvm_feature_string_turns_off_what_is_not_allowed():
    cpu = {"avx2": True, "avx512f": True, "amx-tile": False, "fma": True}
    allowed = {"avx2": True, "fma": True}
    assert _host.llvm_feature_string(cpu, allowed) == "-amx-tile,+avx2,-avx512f,+fma"


# A loop LLVM vectorises by itself: with AVX-512 allowed it uses zmm registers and mask
# registers (Zen 4, Sapphire Rapids); lowered to AVX2, neither, nor ymm16-31 (AVX512VL).
_VECTORISED_LOOP = """
    import json, re
    import numpy as np
    import convengine
    from convengine import _host
    import numba

    @numba.njit(fastmath=True)
    def f(a, b, c):
        for i in range(a.size):
            c[i] = a[i] * b[i] + c[i] if a[i] > 0 else c[i]
        return c.sum()

    a = np.ones(1000, np.float32)
    f(a, a, a.copy())
    asm = "".join(f.inspect_asm().values())
    print(json.dumps(dict(isa=_host.ISA, lowered=_host.LLVM_TARGET_LOWERED,
                          evex=bool(re.search(r"zmm|%k[1-7]|ymm(1[6-9]|2[0-9]|3[01])", asm)))))
"""


@pytest.mark.skipif(not _host.CPU_FEATURES.get("avx512f"), reason="the CPU has no AVX-512")
def test_a_lowered_isa_lowers_the_code_llvm_generates_too():
    native, lowered = (_python(_VECTORISED_LOOP, isa) for isa in (None, "avx2"))
    assert native.returncode == 0 and lowered.returncode == 0, native.stderr + lowered.stderr
    native_out = json.loads(native.stdout.splitlines()[-1])
    lowered_out = json.loads(lowered.stdout.splitlines()[-1])
    assert native_out["evex"], "the control should use AVX-512 registers"
    assert lowered_out == {"isa": "avx2", "lowered": True, "evex": False}


def test_an_unknown_or_too_high_level_fails_at_import():
    res = _python("import convengine", "sse9")
    assert res.returncode != 0 and "CONVENGINE_ISA must be one of" in res.stderr
    if _host.CPU_ISA != "amx":
        res = _python("import convengine", "amx")
        assert res.returncode != 0 and "is above this CPU's instruction set" in res.stderr


@pytest.mark.skipif(not CAN_AVX2, reason="the CPU has no AVX2")
def test_avx2_kernels_get_their_own_cache_entries(monkeypatch):
    """Generated kernels: a module name (fingerprint) of their own; numba's cache of the
    module kernels: an index key of its own. A cache shared by both levels never loads
    the other's vector width."""
    home = "convengine.algorithms.blocked.forward"
    code = f"""
        from convengine import _host, _kernel_cache as kc
        import {home}
        print(_host.ISA, _host.VECTOR_BYTES, kc.source_digest({home!r}), kc.fingerprint({home!r}),
              *kc.compile_target())
    """
    res = _python(code, "avx2")
    assert res.returncode == 0, res.stderr
    isa, width, digest, fingerprint, cpu_name, cpu_features = res.stdout.split()
    assert (isa, width) == ("avx2", "32")
    # the subprocess's fingerprint from its parts (its sources as it read them, the
    # LLVM target it compiled for: lowered to AVX2 where the CPU has more)
    monkeypatch.setattr(kc, "_SOURCE_DIGESTS", {home: digest})
    monkeypatch.setattr(kc, "_FINGERPRINTS", {})
    monkeypatch.setattr(_host, "ISA", "avx2")
    monkeypatch.setattr(kc, "compile_target", lambda: (cpu_name, cpu_features))
    assert kc.fingerprint(home) == fingerprint
    if _host.CPU_ISA != "avx2":  # the default level: another name
        monkeypatch.setattr(kc, "_FINGERPRINTS", {})
        monkeypatch.setattr(_host, "ISA", _host.CPU_ISA)
        assert kc.fingerprint(home) != fingerprint
    key = kc._ModuleCache(_identity)._index_key
    monkeypatch.setattr(_host, "ISA", "avx2")
    avx2_key = key((), _Codegen())
    monkeypatch.setattr(_host, "ISA", "avx512")
    assert key((), _Codegen()) != avx2_key


def _identity(a):
    return a


class _Codegen:
    """What numba's index key reads of a codegen."""

    def magic_tuple(self) -> tuple[str, str, str]:
        return ("x86_64-unknown-linux-gnu", "znver4", "")


# what the subprocess below runs (CONVENGINE_ISA=avx2): float kernels per algorithm and
# pass against the float64 reference
FLOAT_CASES = [
    # algo, pass, N, C, O, size, kernel, stride, pad, groups, dtype
    ("blocked", "forward", 2, 16, 24, 9, 3, 1, 1, 1, "float32"),
    ("blocked", "forward", 1, 8, 40, 7, 3, 2, 1, 1, "float32"),  # float32 only
    ("blocked", "backward_data", 2, 16, 16, 8, 3, 1, 1, 1, "float32"),
    ("blocked", "backward_weight", 2, 16, 24, 8, 3, 1, 1, 1, "float32"),
    ("direct", "forward", 2, 32, 32, 9, 3, 1, 1, 32, "float32"),  # depthwise kernels
    ("direct", "forward", 1, 24, 48, 8, 3, 2, 1, 24, "float64"),  # channel multiplier 2
    ("direct", "backward_data", 2, 32, 32, 9, 3, 1, 1, 32, "float32"),
    ("direct", "backward_data", 1, 16, 16, 9, 3, 2, 1, 16, "float32"),  # gathering kernel
    ("direct", "backward_weight", 2, 32, 32, 9, 3, 1, 1, 32, "float32"),
    ("direct", "forward", 1, 6, 10, 7, 3, 1, 1, 2, "float32"),  # grouped
    ("winograd", "forward", 2, 8, 16, 10, 3, 1, 1, 1, "float32"),
    ("winograd", "backward_data", 1, 8, 16, 10, 3, 1, 1, 1, "float32"),
    ("winograd4", "forward", 1, 8, 16, 12, 3, 1, 1, 1, "float32"),
    ("im2col", "forward", 1, 6, 10, 7, 3, 2, 1, 1, "float32"),
    ("flat_gemm", "forward", 2, 16, 24, 7, 1, 1, 0, 1, "float32"),
]


def run_float_cases() -> list[str]:
    """Each float case against the float64 reference; the failures (empty: all pass)."""
    rng = np.random.default_rng(0)
    failures = []
    for algo, pass_, n, c, o, size, k, s, p, g, dtype in FLOAT_CASES:
        x = random(rng, (n, c, size, size), dtype)
        w = random(rng, (o, c // g, k, k), dtype)
        kw = dict(stride=s, padding=p, groups=g)
        y = ce.conv(x, w, **kw, algo="reference")
        dy = random(rng, y.shape, dtype)
        try:
            if pass_ == "forward":
                got = ce.conv(x, w, **kw, algo=algo)
                want = reference("forward", x, w, **kw)
            elif pass_ == "backward_data":
                got = ce.conv_backward_data(dy, w, x.shape, **kw, algo=algo)
                want = reference("backward_data", dy, w, x.shape, **kw)
            else:
                got = ce.conv_backward_weight(x, dy, w.shape, **kw, algo=algo)
                want = reference("backward_weight", x, dy, w.shape, **kw)
            assert_close(got, want, dtype, f"{algo} {pass_}")
        except Exception as exc:  # noqa: BLE001  (reported by the parent)
            failures.append(f"{algo} {pass_} C{c} O{o} g{g} s{s} {dtype}: {exc!r}")
    return failures


INT8_CASES = [
    # N, C, O, size, kernel, stride, pad, groups, x dtype, w dtype, per-channel
    (2, 16, 24, 9, 3, 1, 1, 1, "uint8", "int8", True),
    (1, 12, 70, 8, 3, 2, 1, 1, "int8", "uint8", False),
    (2, 64, 32, 7, 1, 1, 0, 1, "uint8", "int8", True),
    (1, 130, 40, 6, 3, 1, 1, 1, "uint8", "int8", True),  # several K chunks
    (2, 8, 8, 7, 3, 1, 1, 8, "uint8", "int8", True),  # depthwise
    (1, 48, 48, 9, 3, 2, 1, 48, "int8", "int8", False),
    (1, 12, 6, 6, 1, 1, 0, 3, "int8", "int8", True),  # grouped
]


def run_int8_cases() -> list[str]:
    """qconv's default path on each int8 case, bit-exact against the int64 reference of
    the formula (tests/test_quant_conv's ref_acc, ref_requant); the failures."""
    rng = np.random.default_rng(1)
    failures = []
    for n, c, o, size, k, s, p, g, xdt, wdt, per_channel in INT8_CASES:
        xi, wi = np.iinfo(xdt), np.iinfo(wdt)
        x = rng.integers(xi.min, xi.max + 1, (n, c, size, size)).astype(xdt)
        w = rng.integers(wi.min, wi.max + 1, (o, c // g, k, k)).astype(wdt)
        xzp = int(rng.integers(xi.min, xi.max + 1))
        lo, hi = (-20, 20) if wdt == "int8" else (100, 160)
        wzp = rng.integers(lo, hi, o) if per_channel else int(rng.integers(lo, hi))
        ws = rng.uniform(1e-3, 2e-2, o) if per_channel else float(rng.uniform(1e-3, 2e-2))
        kw = dict(stride=s, padding=p, groups=g)
        acc = ref_acc(x, xzp, w, wzp, (s, s), (p, p), (1, 1), g)
        bias = rng.normal(0, 50, o).astype(np.float32)
        try:
            raw = qconv(x, 0.02, xzp, w, ws, wzp, out_dtype=np.int32, **kw)
            assert_equal_q(raw, acc, "raw accumulator")
            for relu, out_dtype, mode in [(False, np.uint8, "float"), (True, np.int8, "float"),
                                          (True, np.uint8, "int32")]:
                b = bias if mode == "float" else np.round(bias * 100).astype(np.int32)
                want = ref_requant(acc, 0.02, ws, 0.7, 3, b, out_dtype=out_dtype, relu=relu,
                                   bias_mode=mode, axis=1)
                y = qconv(x, 0.02, xzp, w, ws, wzp, b, out_scale=0.7, out_zero_point=3,
                          out_dtype=out_dtype, relu=relu, bias_mode=mode, **kw)
                assert_equal_q(y, want, f"relu={relu} {mode} {np.dtype(out_dtype)}")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"C{c} O{o} k{k} s{s} g{g} {xdt}x{wdt}: {exc!r}")
    return failures


@pytest.mark.slow
@pytest.mark.skipif(not CAN_AVX2, reason="the CPU has no AVX2")
def test_avx2_float_and_int8_kernels_on_this_host():
    code = """
        import json, sys
        sys.path.insert(0, "tests")
        import convengine as ce
        from convengine import _host, quant
        from convengine.algorithms.blocked import forward as blocked
        from test_isa import run_float_cases, run_int8_cases
        try:
            ce.config.set(int8_path="vnni")
            refused = False
        except ce.ConvSetupError:
            refused = True
        print(json.dumps(dict(isa=_host.ISA, vector_bytes=_host.VECTOR_BYTES,
                              lanes=blocked.VEC, avx512=sorted(
                                  f for f in _host.FEATURES if f.startswith("avx512")),
                              int8_path=quant.int8_path(), vnni_refused=refused,
                              float_failures=run_float_cases(),
                              int8_failures=run_int8_cases())))
    """
    res = _python(code, "avx2")
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["isa"] == "avx2" and out["vector_bytes"] == 32 and out["lanes"] == 8
    assert out["avx512"] == []
    assert out["int8_path"] == "avx2" and out["vnni_refused"]
    assert out["float_failures"] == []
    assert out["int8_failures"] == []
