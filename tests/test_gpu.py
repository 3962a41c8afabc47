"""The Triton GPU algorithms against the float64 reference; int8 bit-exact with the
CPU qconv. By default Triton's interpreter runs them on CPU torch tensors
(``TRITON_INTERPRET=1``, set here before the kernels are imported; small shapes: the
interpreter runs every program in numpy); with ``TRITON_INTERPRET=0`` on a machine
with a GPU the same tests run on CUDA tensors. Tests that need a GPU skip without one."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import convengine as ce  # noqa: E402
from convengine.gpu import dispatch, tuning  # noqa: E402

if not tuning.INTERPRET and not torch.cuda.is_available():
    pytest.skip("triton was imported without TRITON_INTERPRET=1 and there is no GPU",
                allow_module_level=True)
DEVICE = "cpu" if tuning.INTERPRET else "cuda"

GEMM, DIRECT = "gpu_implicit_gemm", "gpu_direct"
RNG = np.random.default_rng(16)


def _t(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.from_numpy(RNG.standard_normal(shape).astype(np.float32)).to(DEVICE, dtype)


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.double().cpu().numpy()


def _close(got: torch.Tensor, want: np.ndarray, rtol: float = 1e-5) -> None:
    """Error within ``rtol`` of the output scale (the largest |reference| value)."""
    assert tuple(got.shape) == want.shape
    scale = max(float(np.abs(want).max()), 1e-30)
    assert got.device.type == DEVICE
    err = float(np.abs(got.double().cpu().numpy() - want).max()) / scale
    assert err <= rtol, f"relative error {err:.2e} > {rtol:.0e}"


CASES = [  # (x shape NCHW, w shape, conv args): 1-D, 2-D, 3-D; stride, padding, dilation
    ((2, 5, 9, 8), (7, 5, 3, 3), dict(stride=2, padding=1)),
    ((1, 4, 11), (6, 4, 3), dict(dilation=2, padding=[(1, 2)])),
    ((1, 3, 4, 5, 6), (4, 3, 2, 3, 2), dict(stride=(1, 2, 1), padding=1)),
    ((1, 6, 5, 4), (3, 3, 3, 4), dict(padding="same", layout="NHWC")),
]


@pytest.mark.parametrize("algo", [GEMM, DIRECT])
@pytest.mark.parametrize("xs,ws,kw", CASES)
def test_three_passes_match_reference(algo: str, xs: tuple, ws: tuple, kw: dict) -> None:
    x, w = _t(xs), _t(ws)
    want = ce.conv(_f64(x), _f64(w), algo="reference", **kw)
    _close(ce.conv(x, w, algo=algo, **kw), want)
    dy = _t(want.shape)
    want_dx = ce.conv_backward_data(_f64(dy), _f64(w), xs, algo="reference", **kw)
    _close(ce.conv_backward_data(dy, w, xs, algo=algo, **kw), want_dx)
    want_dw = ce.conv_backward_weight(_f64(x), _f64(dy), ws, algo="reference", **kw)
    _close(ce.conv_backward_weight(x, dy, ws, algo=algo, **kw), want_dw)


@pytest.mark.parametrize("groups,ws", [(2, (6, 2, 3, 3)), (4, (8, 1, 3, 3))])  # grouped, depthwise
def test_direct_serves_groups_and_depthwise(groups: int, ws: tuple) -> None:
    xs, kw = (2, 4, 7, 6), dict(stride=(2, 1), padding=1, groups=groups)
    x, w = _t(xs), _t(ws)
    want = ce.conv(_f64(x), _f64(w), algo="reference", **kw)
    _close(ce.conv(x, w, algo=DIRECT, **kw), want)
    dy = _t(want.shape)
    _close(ce.conv_backward_data(dy, w, xs, algo=DIRECT, **kw),
           ce.conv_backward_data(_f64(dy), _f64(w), xs, algo="reference", **kw))
    _close(ce.conv_backward_weight(x, dy, ws, algo=DIRECT, **kw),
           ce.conv_backward_weight(_f64(x), _f64(dy), ws, algo="reference", **kw))
    with pytest.raises(ce.ConvSetupError, match="groups"):
        ce.conv(x, w, algo=GEMM, **kw)


@pytest.mark.parametrize("dtype,rtol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_half_inputs_accumulate_in_float32(dtype: torch.dtype, rtol: float) -> None:
    x, w = _t((2, 32, 6, 6), dtype), _t((16, 32, 3, 3), dtype)
    want = ce.conv(_f64(x), _f64(w), padding=1, algo="reference")
    y = ce.conv(x, w, padding=1, algo=GEMM)
    assert y.dtype == dtype
    _close(y, want, rtol)  # 288-term sums: fp16/bf16 accumulation would miss these bounds
    dy = _t(want.shape, dtype)
    dw = ce.conv_backward_weight(x, dy, w.shape, padding=1, algo=GEMM)
    _close(dw, ce.conv_backward_weight(_f64(x), _f64(dy), w.shape, padding=1, algo="reference"),
           rtol)


@pytest.mark.parametrize("activation", ["relu", "silu", "gelu"])
def test_bias_and_activation_in_the_epilogue(activation: str) -> None:
    x, w, b = _t((1, 6, 5, 5)), _t((5, 6, 3, 3)), _t((5,))
    want = torch.from_numpy(ce.conv(_f64(x), _f64(w), _f64(b), algo="reference"))
    act = {"relu": torch.relu, "silu": torch.nn.functional.silu,
           "gelu": torch.nn.functional.gelu}[activation]
    y = dispatch.conv(x, w, b, algo=GEMM, activation=activation)
    _close(y, act(want).numpy())
    with pytest.raises(ValueError, match="activation"):
        dispatch.conv(x, w, b, algo=GEMM, activation="tanh")


def test_conv_transpose_with_output_padding_and_bias() -> None:
    x, w, b = _t((2, 4, 4, 5)), _t((4, 3, 3, 3)), _t((3,))
    kw = dict(stride=2, padding=1, output_padding=1)
    want = ce.conv_transpose(_f64(x), _f64(w), _f64(b), algo="reference", **kw)
    for algo in (GEMM, DIRECT):
        _close(ce.conv_transpose(x, w, b, algo=algo, **kw), want)


@pytest.mark.parametrize("xs,ws,kw", [
    ((1, 5, 11, 10), (6, 5, 3, 3), dict(stride=3, dilation=2, padding=[(2, 1), (0, 3)])),
    ((2, 4, 9, 8), (3, 4, 3, 2), dict(stride=2, dilation=2, padding=1)),  # phases without taps
    ((1, 3, 5, 6, 7), (4, 3, 1, 3, 2), dict(stride=(2, 1, 3), padding=(0, 1, 1))),
])
def test_strided_backward_data_by_phases(xs: tuple, ws: tuple, kw: dict) -> None:
    dy_shape = ce.conv(np.zeros(xs), np.zeros(ws), algo="reference", **kw).shape
    dy, w = _t(dy_shape), _t(ws)
    want = ce.conv_backward_data(_f64(dy), _f64(w), xs, algo="reference", **kw)
    _close(ce.conv_backward_data(dy, w, xs, algo=GEMM, **kw), want)


def test_conv_transpose_bias_reaches_positions_no_tap_reaches() -> None:
    x, w, b = _t((1, 4, 3, 3)), _t((4, 2, 1, 1)), _t((2,))  # 1x1 stride 2: odd rows get b only
    want = ce.conv_transpose(_f64(x), _f64(w), _f64(b), stride=2, algo="reference")
    _close(ce.conv_transpose(x, w, b, stride=2, algo=GEMM), want)


def _q(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


QCASES = [  # (x dtype, w dtype, groups, algo, bias mode, out dtype)
    (np.uint8, np.int8, 1, GEMM, "float", np.uint8),
    (np.int8, np.uint8, 1, GEMM, "int32", np.int8),
    (np.uint8, np.int8, 1, GEMM, "int32", np.int32),
    (np.int8, np.int8, 2, DIRECT, "float", np.int8),
    (np.uint8, np.int8, 8, DIRECT, "int32", np.uint8),
]


@pytest.mark.parametrize("xdt,wdt,groups,algo,mode,odt", QCASES)
@pytest.mark.slow
def test_qconv_bit_exact_with_cpu(xdt: type, wdt: type, groups: int, algo: str, mode: str,
                                  odt: type) -> None:
    x, w = _q((2, 8, 7, 9), xdt), _q((8, 8 // groups, 3, 3), wdt)
    xzp = 3 if xdt is np.uint8 else -2
    wzp = RNG.integers(-3, 4, 8) if wdt is np.int8 else RNG.integers(120, 130, 8)
    ws = RNG.uniform(0.001, 0.01, 8).astype(np.float32)
    bias = (RNG.normal(size=8).astype(np.float32) if mode == "float"
            else RNG.integers(-1000, 1000, 8).astype(np.int32))
    args: dict = dict(bias_mode=mode, out_dtype=odt, stride=(1, 2), padding=1, groups=groups)
    if odt is not np.int32:
        args.update(out_scale=0.05, out_zero_point=7, relu=mode == "float")
    want = ce.qconv(x, 0.02, xzp, w, ws, wzp, bias, **args)
    got = ce.qconv(torch.from_numpy(x).to(DEVICE), 0.02, xzp, torch.from_numpy(w).to(DEVICE),
                   ws, wzp, bias, algo=algo, **args)
    assert got.dtype == {np.uint8: torch.uint8, np.int8: torch.int8, np.int32: torch.int32}[odt]
    assert len(np.unique(want)) > 10  # not saturated: the rounding is exercised
    assert got.device.type == DEVICE
    np.testing.assert_array_equal(got.cpu().numpy(), want)


def test_gpu_algorithms_listed_and_explained() -> None:
    assert ce.list_algorithms("backward_weight", device="cuda") == [GEMM, DIRECT]
    with pytest.raises(ce.ConvSetupError, match="device"):
        ce.list_algorithms("forward", device="tpu")
    e = dispatch.explain("forward", _t((1, 4, 5, 5)), _t((4, 1, 3, 3)), groups=4)
    assert e.chosen == DIRECT and GEMM in e.refused and "groups" in e.refused[GEMM]
    # backward-weight splits the positions in two under the interpreter: 2 float32 dw
    e = dispatch.explain("backward_weight", _t((2, 4, 9, 9)), _t((2, 6, 9, 9)), (6, 4, 3, 3),
                         padding=1)
    assert e.chosen == GEMM
    if tuning.INTERPRET:
        assert e.workspace_bytes[GEMM] == 2 * 6 * 4 * 9 * 4


def test_bad_requests_are_setup_errors() -> None:
    x, w = _t((1, 4, 5, 5)), _t((4, 4, 3, 3))
    with pytest.raises(ce.ConvSetupError, match="float64"):
        ce.conv(x.double(), w.double(), algo=GEMM)
    with pytest.raises(ce.ConvSetupError, match="not a GPU algorithm"):
        dispatch.conv(x, w, algo="im2col")
    with pytest.raises(ce.ConvSetupError, match="w.dtype"):
        ce.conv(x, w.half(), algo=GEMM)


@pytest.mark.slow
def test_cpu_calls_import_neither_triton_nor_the_gpu_kernels() -> None:
    code = ("import sys, numpy as np, convengine as ce; "
            "ce.conv(np.ones((1, 2, 4, 4), np.float32), np.ones((3, 2, 3, 3), np.float32)); "
            "bad = [m for m in ('triton', 'convengine.gpu.kernels') if m in sys.modules]; "
            "assert not bad, bad")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none present)")
def test_cuda_tensors_stay_on_the_device() -> None:
    x, w = _t((2, 16, 9, 9)).cuda(), _t((32, 16, 3, 3)).cuda()
    y = ce.conv(x, w, padding=1)  # auto: CUDA operands choose the GPU algorithms
    assert y.is_cuda
    want = ce.conv(_f64(x), _f64(w), padding=1, algo="reference")
    assert np.abs(y.double().cpu().numpy() - want).max() <= 1e-5 * np.abs(want).max()


def test_torch_functions_and_modules_route_to_the_gpu() -> None:
    import convengine.torch as cet

    torch.manual_seed(16)
    m = cet.Conv2d(6, 8, 3, stride=2, padding=1, algo=GEMM)
    t = cet.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1, algo=DIRECT)
    m, t = m.to(DEVICE), t.to(DEVICE)
    x = torch.randn(2, 6, 7, 7, device=DEVICE, requires_grad=True)
    (t(m(x)) ** 2).sum().backward()
    grads = [x.grad, m.weight.grad, m.bias.grad, t.weight.grad, t.bias.grad]
    x2 = x.detach().double().cpu().requires_grad_()
    w1, b1, w2, b2 = (p.detach().double().cpu().requires_grad_() for p in
                      (m.weight, m.bias, t.weight, t.bias))
    y = torch.nn.functional.conv2d(x2, w1, b1, stride=2, padding=1)
    y = torch.nn.functional.conv_transpose2d(y, w2, b2, stride=2, padding=1, output_padding=1)
    (y ** 2).sum().backward()
    for got, want in zip(grads, [x2.grad, w1.grad, b1.grad, w2.grad, b2.grad]):
        _close(got, want.numpy(), 1e-5)


def test_kernels_compile_for_a_real_gpu() -> None:
    """What the interpreter does not check (dot shapes and dtypes, constexpr rules,
    shared memory, tensor-core lowering): one variant of each kernel compiled to an
    sm_90 cubin, no GPU needed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "convengine.gpu.aot", "90"], env=env,
                         check=True, capture_output=True, text=True, timeout=600).stdout
    built = ast.literal_eval(out.strip().splitlines()[-1])  # name -> (shared bytes, mma)
    assert set(built) == {"igemm_bf16", "igemm_int8", "direct_int8", "dgrad_phased_bf16",
                          "wgrad_direct_fp16", "wgrad_bf16"}
    assert max(shared for shared, _ in built.values()) <= 99 * 1024  # sm_86's opt-in limit
    assert all(built[k][1] for k in ("igemm_bf16", "igemm_int8", "dgrad_phased_bf16",
                                     "wgrad_bf16"))  # tensor cores
    assert built["igemm_bf16"][0] > 2 * 128 * 32 * 2  # A and B tiles pipelined (> 1 stage)


def test_autotune_configurations_are_legal_and_pruned_to_shared_memory() -> None:
    for int8 in (False, True):
        configs = tuning._gemm_configs(int8)
        for c in configs:
            blocks = [c.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")]
            assert all(b >= 16 and b & (b - 1) == 0 for b in blocks)  # powers of two, dot >= 16
            assert not int8 or c.kwargs["BLOCK_K"] >= 64
    configs = tuning._gemm_configs(False)
    shapes = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_stages)
              for c in tuning.fitting(configs, 4, 64 * 1024)]
    assert shapes == [(64, 64, 32, 4)]  # 4 stages x (64 + 64) x 32 x 4 bytes = 64 KiB
    assert len(tuning.fitting(configs, 2, 228 * 1024)) == len(configs)  # H100/H200: all fit
    smallest = tuning.fitting(configs, 4, 1024)  # nothing fits: the smallest footprint
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"]) for c in smallest] == [(64, 32)]


def test_graph_plan_runs_on_the_gpu_algorithms() -> None:
    from convengine.graph import gpu as gpu_graph

    g = ce.Graph(io_dtype="float32")
    x = g.tensor("x", (2, 8, 6, 6))
    w = g.tensor("w", (16, 8, 3, 3))
    b = g.tensor("b", (16,))
    r = g.tensor("r", (2, 16, 6, 6))
    y = g.silu(g.add(g.bias(g.conv_fprop(x, w, padding=1), b), r)).set_output()
    plan = g.build()
    vals = {"x": _t((2, 8, 6, 6)), "w": _t((16, 8, 3, 3)), "b": _t((16,)), "r": _t((2, 16, 6, 6))}
    got = gpu_graph.execute(plan.program, vals)[y.name]
    v = ce.conv(_f64(vals["x"]), _f64(vals["w"]), padding=1, algo="reference")
    v = v + _f64(vals["b"])[:, None, None] + _f64(vals["r"])
    _close(got, v / (1 + np.exp(-v)))


def test_autotuner_choices_recorded_in_the_tuning_cache(tmp_path, monkeypatch) -> None:
    import triton

    from convengine.gpu import records
    from convengine.tune.tuner import default_cache

    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path))
    configs = tuning._gemm_configs(False)[:3]
    which = records.ident("igemm", (1024, 64, 576, "EPI=0", "torch.bfloat16"),
                          "NVIDIA H200 sm_90", configs)
    assert records.recorded(which) is None
    timings = {configs[0]: [0.5, 0.4, 0.6], configs[1]: [0.3, 0.2, 0.4],
               configs[2]: [float("inf")] * 3}  # the autotuner's ms; inf: did not run
    records.record(which, "forward", "a problem", timings)
    got = records.recorded(which)
    assert isinstance(got, triton.Config)
    assert records.config_text(got) == records.config_text(configs[1])  # the fastest
    entry = default_cache().get(which)
    assert entry is not None and entry.host == "NVIDIA H200 sm_90"
    assert entry.results[records.config_text(configs[1])]["median_s"] == pytest.approx(3e-4)
    assert "error" in entry.results[records.config_text(configs[2])]
    other = records.ident("igemm", (1024, 64, 576, "EPI=0", "torch.bfloat16"),
                          "NVIDIA A100 sm_80", configs)
    assert records.recorded(other) is None  # another device decides afresh


def test_tuned_launches_record_then_reuse_the_choice(tmp_path, monkeypatch) -> None:
    """The tuned launch path with a stand-in autotuner (the real one needs a GPU): the
    first call autotunes and records, the next launches the recorded configuration."""
    import triton

    from convengine import builders
    from convengine.gpu import kernels
    from convengine.gpu.algorithms import ALGORITHMS

    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path))
    small = [triton.Config({"BLOCK_M": m, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 8},
                           num_warps=4, num_stages=2) for m in (32, 64)]
    calls = []

    class StandIn:
        configs = small
        configs_timings: dict = {}

        def __getitem__(self, grid: object) -> object:
            def run(*args: object, **kw: object) -> None:
                calls.append(kw)
                self.configs_timings = {small[0]: [2.0, 1.9, 2.1], small[1]: [1.0, 0.9, 1.1]}
                kernels.igemm_kernel[grid](*args, **kw, **small[1].all_kwargs())
            return run

    monkeypatch.setattr(tuning, "_autotuned", lambda kernel, int8: StandIn())
    monkeypatch.setattr(tuning, "_device_name", lambda device: "stand-in GPU")
    monkeypatch.setattr(tuning, "INTERPRET", False)  # take the tuned path
    monkeypatch.setattr(tuning, "_RECORDED", set())
    x, w = _t((1, 16, 5, 5)), _t((16, 16, 3, 3))
    problem = builders.forward_problem(dispatch.meta(x), dispatch.meta(w), padding=1)
    want = ce.conv(_f64(x), _f64(w), padding=1, algo="reference")
    for _ in range(2):
        y = ALGORITHMS["forward"][GEMM].run(problem, dispatch.canonical(x, "NCHW"),
                                            dispatch.canonical(w, "NCHW"))
        _close(dispatch.restore(y, problem.y_shape("NHWC"), "NCHW"), want)
    assert len(calls) == 1 and calls[0]["enable_fp_fusion"] is False  # autotuned once
    entries = [e for e in tuning.records.default_cache().entries() if e.host == "stand-in GPU"]
    assert len(entries) == 1 and entries[0].key.startswith("gpu igemm 32 16 256")
