"""The int8 conv on the CPU: a :class:`QuantPlan` per problem, bound to a kernel.

``qconv`` validates its arguments into a plan (cached on their values), picks the
kernel path (AMX, VNNI, AVX2, portable, depthwise) and runs it: exact in int32,
requantized as PyTorch or ONNX. The plan entry points (:func:`make_plan`,
:func:`cached_plan`, :func:`canonical`, :func:`run`, :func:`bind`) serve the fronts
that hold their own weights (``convengine.torch``, ``convengine.onnx``, the graph
engines).

Validation reuses :func:`convengine.problem.make_problem` for shapes (so shape
errors read as in the float API) and :mod:`.numerics` for scales and zero points.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import ConvSetupError
from ..problem import ConvProblem, as_array, make_problem
from ..threads import get_num_threads
from . import cpu
from .dense import kernels
from .dense.amx import tile_config
from .depthwise import avx2 as depthwise_avx2
from .depthwise import kernels as depthwise_kernels
from .numerics import (
    BIAS_MODES,
    Requant,
    check_int32_bias,
    check_int_dtype,
    check_scale,
    check_zero_point,
    requant_params,
)
from .prepack import Packed, pack, packed_weights

ALGOS = ("auto", "amx", "vnni", "avx2", "portable", "depthwise")
_TILE_CONFIG = tile_config()
# Shortest reductions C/g * prod(K) worth AMX tiles (measured against VNNI here: with
# im2col 0.6-0.8x at K = 64-192, 1.1-1.5x from 288 up; reading x in place 1.0x at
# K = 64, 1.8x at 128).
AMX_MIN_K = 256
AMX_MIN_K_DIRECT = 128
IMPLICIT_MIN_WIDTH = 12  # see _implicit
_DTYPES = {np.dtype(np.uint8): "uint8", np.dtype(np.int8): "int8"}
# Largest row buffer of the depthwise kernels (kernel rows x padded input width x
# channels, one per output row): its fill is proportional to the padded width, so a
# padding far wider than the input (10**8: 144 s) goes to the dense path instead.
DEPTHWISE_MAX_ROW_BYTES = 64 * 2**20


def _int_array(value: Any, name: str, allowed: tuple[str, ...]) -> np.ndarray:
    """The 8-bit array ``value`` (x_q and w_q both take uint8 and int8)."""
    a = as_array(value, name)
    if a.dtype not in _DTYPES:
        raise ConvSetupError(
            f"{name} must be an integer array of dtype {' or '.join(allowed)}, got dtype "
            f"{a.dtype}" + (" (quantize float data first with convengine.quantize)"
                           if np.issubdtype(a.dtype, np.floating) else "")
        )
    return a


def canonical(a: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """(N|O, C, *S) or (N|O, *S, C) -> (N|O, D, H, W, C) C-contiguous, unit dims in front.
    Idempotent: an array already in that form comes back as it is."""
    if a.ndim == 5 and (problem.ndim < 3 or problem.layout == "NHWC"):
        return np.ascontiguousarray(a)
    if problem.layout == "NCHW":
        a = np.moveaxis(a, 1, -1)
    pad = 3 - problem.ndim
    return np.ascontiguousarray(a.reshape(a.shape[0], *(1,) * pad, *a.shape[1:]))


def geometry(problem: ConvProblem) -> np.ndarray:
    def three(values: tuple[int, ...], fill: int) -> list[int]:
        return [fill] * (3 - problem.ndim) + list(values)

    pads = tuple(lo for lo, _ in problem.padding)
    return np.array(
        three(problem.kernel, 1) + three(problem.stride, 1) + three(pads, 0)
        + three(problem.dilation, 1) + three(problem.out_size, 1),
        dtype=np.int64,
    )


def choose_algo(problem: ConvProblem, algo: str) -> str:
    """The kernel that serves ``problem``: ``auto`` picks depthwise where it applies
    (groups == C == O, at most 258 taps), else the CPU's dense path (AMX only for
    reductions C/g * prod(K) of at least ``AMX_MIN_K`` values, ``AMX_MIN_K_DIRECT``
    when x is read in place; VNNI below)."""
    if algo not in ALGOS:
        raise ConvSetupError(f"unknown algo {algo!r} for qconv; expected one of {ALGOS}")
    taps = int(np.prod(problem.kernel))
    depthwise = (
        problem.is_depthwise
        and problem.out_channels == problem.in_channels
        and taps <= depthwise_kernels.MAX_TAPS
        and _depthwise_row_bytes(problem) <= DEPTHWISE_MAX_ROW_BYTES
    )
    if algo == "depthwise" and not depthwise:
        raise ConvSetupError(
            "algo='depthwise' needs groups == in_channels == out_channels, at most "
            f"{depthwise_kernels.MAX_TAPS} kernel taps and a row buffer (kernel rows x "
            f"padded width x channels) of at most {DEPTHWISE_MAX_ROW_BYTES:,} bytes; got "
            f"{problem.describe()}"
        )
    if algo == "vnni" and not cpu.HAS_VNNI:
        raise ConvSetupError("algo='vnni' needs a CPU with AVX512-VNNI; this one lacks it")
    if algo == "amx" and not cpu.HAS_AMX:
        raise ConvSetupError("algo='amx' needs a CPU with AMX-INT8 and the OS granting it")
    if algo == "avx2" and not cpu.HAS_AVX2:
        raise ConvSetupError("algo='avx2' needs a CPU with AVX2; this one lacks it")
    if algo != "auto":
        return algo
    if depthwise:
        return "depthwise"
    path = cpu.int8_path()
    min_k = AMX_MIN_K_DIRECT if _in_place(problem, 64) else AMX_MIN_K
    if path == "amx" and problem.in_per_group * taps < min_k:
        return "vnni"  # short K: tile set-up and stores outweigh the tile products
    return path


def _depthwise_row_bytes(problem: ConvProblem) -> int:
    """Bytes of the depthwise kernels' buffer for one output row: the kernel rows (in
    groups of 4) x the padded input columns that row reads x 16-rounded channels x 4."""
    rows = math.prod(problem.kernel[:-1])
    width = (problem.out_size[-1] - 1) * problem.stride[-1] + problem.effective_kernel[-1]
    return -(-rows // 4) * width * -(-problem.in_channels // 16) * 16 * 4


def _in_place(problem: ConvProblem, multiple: int) -> bool:
    """A 1x1 stride-1 unpadded ungrouped conv on uint8 whose C is a multiple of
    ``multiple``: the GEMM reads x where it lies (no im2col)."""
    return (problem.is_pointwise and problem.groups == 1 and problem.dtype == "uint8"
            and problem.in_channels % multiple == 0)


def _channels_to_4(packed: Packed, w: np.ndarray, problem: ConvProblem,
                   wzp: np.ndarray) -> Packed:
    """``packed`` where C is a multiple of 4, else the weights with their channels padded
    with zeros to one (packed afresh: a network's 3-channel stem, weights of a few KiB),
    as :func:`kernels.conv_vnni_taps` reads x."""
    c = problem.in_channels
    if c % 4 == 0:
        return packed
    wc = canonical(w, problem)
    wide = np.zeros((*wc.shape[:-1], -(-c // 4) * 4), wc.dtype)
    wide[..., :c] = wc
    return pack(wide, wzp, 1, "vnni")


def _implicit(problem: ConvProblem, flip: int, mode: int, wzp: np.ndarray) -> bool:
    """Whether :func:`kernels.conv_vnni_taps` (implicit GEMM, no im2col) serves: 2-D,
    ungrouped, dilation 1, more than one tap, uint8 x, an 8-bit output (PyTorch's or
    ONNX's requantization), weight zero points 0, at least 64 output channels (its
    tiles are 64 wide: MobileNetV2's 32-channel stem 1.17x the time of im2col's narrow
    kernels) and outputs at least ``IMPLICIT_MIN_WIDTH`` wide (its tiles are runs of
    one output row; measured, 1 thread, against im2col: 3x3 at 56 x 56 x 64 0.80x the
    time, 28 x 28 x 128 0.90x, 14 x 14 x 256 0.96x, 7 x 7 x 512 1.12x; ResNet-50's
    stem 0.90x)."""
    return (problem.ndim == 2 and problem.groups == 1 and math.prod(problem.kernel) > 1
            and problem.dilation == (1, 1) and flip == 0 and mode != 2 and not np.any(wzp)
            and problem.out_channels >= 64 and problem.out_size[-1] >= IMPLICIT_MIN_WIDTH)


def qconv(
    x_q: Any,
    x_scale: Any,
    x_zero_point: Any,
    w_q: Any,
    w_scale: Any,
    w_zero_point: Any,
    bias: Any = None,
    *,
    out_scale: Any = None,
    out_zero_point: Any = None,
    out_dtype: Any = np.uint8,
    relu: bool = False,
    bias_mode: str = "float",
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    algo: str = "auto",
) -> np.ndarray:
    """Quantized convolution; returns ``y_q`` in ``layout`` and ``out_dtype``.

    x_q ``(N, C, *S)`` uint8/int8, w_q ``(O, C // groups, *K)`` int8/uint8 (NCHW; or
    channels-last with ``layout="NHWC"``), 1-3 spatial dims. ``w_scale`` and
    ``w_zero_point`` are scalars or one per output channel. The exact int32
    accumulator ``sum (x_q - x_zp)(w_q - w_zp)`` is requantized as
    :mod:`convengine.quant.numerics` describes: ``bias_mode="float"`` (float32 bias,
    PyTorch fbgemm) or ``"int32"`` (int32 bias, ONNX QLinearConv). ReLU clamps at
    ``out_zero_point``. ``out_dtype=np.int32`` returns the accumulator (plus an
    int32 bias if given), as ONNX ConvInteger; scales other than x/w are then unused.
    """
    x = _int_array(x_q, "x_q", ("uint8", "int8"))
    w = _int_array(w_q, "w_q", ("int8", "uint8"))
    args = (x.shape, x.dtype, w.shape, w.dtype, x_scale, x_zero_point, w_scale, w_zero_point,
            bias, out_scale, out_zero_point, out_dtype, relu, bias_mode, stride, padding,
            dilation, groups, layout, algo)
    plan = cached_plan(args)
    problem = plan.problem
    y = np.empty((problem.batch * math.prod(problem.out_size), problem.out_channels),
                 dtype=plan.out_dtype)
    if y.size:
        run(plan, canonical(x, problem), w, y)
    y = y.reshape(problem.y_shape("NHWC"))
    if problem.layout == "NCHW":
        y = np.ascontiguousarray(np.moveaxis(y, -1, 1))
    return y


@dataclass(frozen=True)
class QuantPlan:
    """Everything qconv derives from its arguments except the two tensors."""

    problem: ConvProblem
    path: str
    geometry: np.ndarray
    x_zero_point: int
    w_zero_point: np.ndarray
    requant: Requant
    mode: int
    out_dtype: np.dtype


_plans: OrderedDict[Any, QuantPlan] = OrderedDict()


_SIMPLE = frozenset({int, float, str, bool, type(None), np.dtype})


def _key(value: Any) -> Any:
    """A hashable stand-in for an argument (arrays by dtype, shape and bytes), typed so
    that e.g. ``True`` and ``1`` stay apart."""
    kind = type(value)
    if kind in _SIMPLE:
        return (kind, value)
    if kind is tuple and all(type(v) is int for v in value):
        return value  # a shape
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_key(v) for v in value))
    if isinstance(value, type):
        return np.dtype(value).str if issubclass(value, np.generic) else value
    return (type(value).__name__, value)


def cached_plan(args: tuple) -> QuantPlan:
    """:func:`_plan` memoised on the arguments' values (never their identity)."""
    try:
        key = (cpu.int8_path(), *map(_key, args))
        hash(key)
    except TypeError:  # an unhashable argument (e.g. a tensor scale): plan afresh
        return make_plan(*args)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = make_plan(*args)
        while len(_plans) > 256:
            _plans.popitem(last=False)
    return plan


def make_plan(x_shape: tuple[int, ...], x_dtype: np.dtype, w_shape: tuple[int, ...],
          w_dtype: np.dtype, x_scale: Any, x_zero_point: Any, w_scale: Any,
          w_zero_point: Any, bias: Any, out_scale: Any, out_zero_point: Any,
          out_dtype: Any, relu: bool, bias_mode: str, stride: Any, padding: Any,
          dilation: Any, groups: Any, layout: Any, algo: str) -> QuantPlan:
    """Validate every argument and fold the constants the kernels need."""
    problem = make_problem(
        "forward", x_shape, w_shape, dtype=_DTYPES[x_dtype], stride=stride, padding=padding,
        dilation=dilation, groups=groups, layout=layout, has_bias=bias is not None,
        x_name="x_q", w_name="w_q",
    )
    o = problem.out_channels
    xzp = int(check_zero_point(x_zero_point, "x_zero_point", x_dtype))
    wzp = np.broadcast_to(check_zero_point(w_zero_point, "w_zero_point", w_dtype, o), (o,))
    odt = check_int_dtype(out_dtype, "out_dtype")
    if bias_mode not in BIAS_MODES:
        raise ConvSetupError(f"bias_mode must be one of {BIAS_MODES}, got {bias_mode!r}")
    if odt == np.int32:
        if relu:
            raise ConvSetupError("relu=True needs an 8-bit out_dtype (uint8 or int8), got int32")
        if bias is not None and bias_mode != "int32":
            raise ConvSetupError(
                "out_dtype=int32 returns the raw accumulator: a bias must be int32 with "
                "bias_mode='int32'"
            )
        check_scale(x_scale, "x_scale")
        check_scale(w_scale, "w_scale", o)
        bias_i = np.zeros(o, np.int32) if bias is None else check_int32_bias(bias, o)
        rq = Requant("raw", np.ones(o, np.float32), bias_i, 0, 0, 0)
        mode = 2
    else:
        if out_scale is None or out_zero_point is None:
            raise ConvSetupError(
                f"out_scale and out_zero_point are required for out_dtype={odt.name}"
            )
        rq = requant_params(x_scale, w_scale, out_scale, out_zero_point, o, bias,
                            out_dtype=odt, relu=relu, bias_mode=bias_mode)
        mode = 0 if bias_mode == "float" else 1
    return QuantPlan(problem, choose_algo(problem, algo), geometry(problem), xzp,
                np.ascontiguousarray(wzp, dtype=np.int64), rq, mode, odt)


def run(plan: QuantPlan, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> None:
    """Run the plan's kernel on canonical x and the caller's w into y ``(M, O)``."""
    bind(plan, w, x.dtype)(x, y)


Residual = tuple[np.ndarray, int, np.ndarray]
_NO_RESIDUAL: Residual = (np.zeros((1, 1), np.uint8), 0, np.zeros(5, np.float32))


class Launch(Protocol):
    """A bound kernel: ``launch(x, y[, res])`` (see :func:`bind`)."""

    def __call__(self, x: np.ndarray, y: np.ndarray, res: Residual = ...) -> None: ...


def residual_add(conv_first: bool, ra: float, rb: float, fixed: float, out_dtype: np.dtype
                 ) -> tuple[int, np.ndarray]:
    """A QLinearAdd's constants in ``launch``'s ``res = (other, *residual_add(...))``,
    ``other`` 8-bit ``(M, O)`` C-contiguous: the conv's result is the add's ``a``
    (``conv_first``) or ``b``; float32 ``ra``, ``rb``, ``fixed`` as
    :func:`kernels.qadd_value` takes them; saturated to ``out_dtype`` (the conv's)."""
    lo, hi = np.iinfo(out_dtype).min, np.iinfo(out_dtype).max
    return 1 if conv_first else 2, np.array([ra, rb, fixed, lo, hi], np.float32)


def _with_residual(run: Callable[[np.ndarray, np.ndarray], None]) -> Launch:
    """``run(x, y)`` followed by the residual add as a pass of its own."""
    def launch(x: np.ndarray, y: np.ndarray, res: Residual = _NO_RESIDUAL) -> None:
        run(x, y)
        if res[1]:
            kernels.add_residual(y, *res)
    return launch


def _u8s8(plan: QuantPlan, w: np.ndarray, flip: int) -> tuple[Packed, np.ndarray, int] | None:
    """(packed weights, column terms, :func:`kernels.few_heavy_pairs` share) of
    :func:`kernels.conv_avx2_u8s8` where it can serve the plan (uint8 x, int8 weights of
    zero point 0, ungrouped, output channels in whole 16-channel tiles, an 8-bit
    result), else None."""
    problem = plan.problem
    if (flip or w.dtype != np.int8 or problem.groups != 1 or plan.mode == 2
            or problem.out_channels % kernels.AVX2_NR or np.any(plan.w_zero_point)):
        return None
    packed = packed_weights(w, lambda a: canonical(a, problem), plan.w_zero_point, 1,
                            "avx2_u8s8")
    assert packed.fixes is not None
    col_term = (-plan.x_zero_point * packed.col_sum).astype(np.int32)
    share = kernels.u8s8_share(problem.out_channels, packed.fixes[1].size / (2 * packed.kc4))
    return packed, col_term, share


def _bind_avx2(plan: QuantPlan, w: np.ndarray, flip: int, tail: tuple) -> Launch:
    """:func:`bind` on the AVX2 path: the byte tiles (:func:`kernels.conv_avx2_u8s8`)
    where they serve and x has few heavy pairs, else the int16 tiles
    (:func:`kernels.conv_avx2`), whose weights are packed when first needed: a layer
    whose calls all take the byte tiles never holds them (ResNet-50's ONNX int8
    session: 51 MB of int16 weights)."""
    problem, groups, geo = plan.problem, plan.problem.groups, plan.geometry
    xzp_u = plan.x_zero_point + flip
    mode, mult, bias_f, bias_i, zp, lo, hi = tail
    zeros = np.zeros(max(problem.out_channels, kernels.AVX2_MR), np.int32)
    direct = problem.is_pointwise and groups == 1
    in_place = _in_place(problem, 4)
    bytewise = _u8s8(plan, w, flip)
    int16: list[Packed] = []

    def int16_weights() -> Packed:
        if not int16:
            int16.append(packed_weights(w, lambda a: canonical(a, problem),
                                        plan.w_zero_point, groups, "avx2"))
        return int16[0]

    if bytewise is None:
        int16_weights()

    def launch_avx2(x: np.ndarray, y: np.ndarray, res: Residual = _NO_RESIDUAL) -> None:
        threads = get_num_threads()
        if (bytewise is not None and y.itemsize == 1 and y.strides[1] == 1
                and kernels.few_heavy_pairs(x, bytewise[2])):
            u8s8, col_term = bytewise[:2]
            assert u8s8.fixes is not None
            prows = kernels.panel_rows(y.shape[0], 4 * u8s8.kc4, threads)
            kernels.conv_avx2_u8s8(x, xzp_u, u8s8.data, col_term, *u8s8.fixes, geo, u8s8.kc,
                                   u8s8.kc4, u8s8.nb, prows, in_place, mode, mult, bias_f,
                                   bias_i, zp, lo, hi, y, *res)
            return
        packed = int16_weights()
        prows = kernels.panel_rows(y.shape[0], 4 * packed.kc4, threads)
        kernels.conv_avx2(x.view(np.uint8), flip, xzp_u, packed.data, geo, groups, packed.kc,
                          packed.kc4, packed.nb, prows, direct, zeros, mode, mult, bias_f,
                          bias_i, zp, lo, hi, y, *res)
    return launch_avx2


def bind(plan: QuantPlan, w: np.ndarray, x_dtype: np.dtype) -> Launch:
    """The plan's kernel with the packed form of the caller's ``w`` and every per-call
    constant bound: ``launch(x, y[, res])`` runs it on canonical x ``(N, D, H, W, C)`` of
    ``x_dtype`` (uint8 or int8) into y ``(M, O)``, then adds :func:`residual` ``res``
    in place (fused into the dense kernels' work items). The weights are looked up (and
    checked) here, once: a caller that keeps ``launch`` binds again when ``w`` changes."""
    problem, rq, path = plan.problem, plan.requant, plan.path
    flip = 0x80 if x_dtype == np.int8 else 0
    xzp_u = plan.x_zero_point + flip
    bias_f = rq.bias if plan.mode == 0 else np.zeros(1, np.float32)
    bias_i = rq.bias if plan.mode != 0 else np.zeros(1, np.int32)
    tail = (plan.mode, rq.multiplier, bias_f, bias_i, rq.zero_point, rq.lo, rq.hi)
    if path == "depthwise" and cpu.int8_path() in ("vnni", "amx"):
        path = "depthwise_vnni"
    if path == "avx2":
        return _bind_avx2(plan, w, flip, tail)
    packed = packed_weights(w, lambda a: canonical(a, problem), plan.w_zero_point,
                            problem.groups, path)
    geo, groups = plan.geometry, problem.groups
    if path == "depthwise_vnni":
        assert packed.dw_term is not None
        dw = (flip, xzp_u, packed.data, packed.dw_term, packed.wzp, packed.dw_raw, geo)

        def launch_dw(x: np.ndarray, y: np.ndarray) -> None:
            threads = get_num_threads()
            if threads == 1 or y.size * packed.kc < depthwise_kernels.SERIAL_MAX_MACS:
                depthwise_kernels.conv_depthwise_vnni_serial(x.view(np.uint8), *dw, *tail, y)
            else:
                depthwise_kernels.conv_depthwise_vnni(x.view(np.uint8), *dw, threads, *tail, y)
        return _with_residual(launch_dw)
    if path == "depthwise":
        in_registers = (cpu.int8_path() != "portable"
                        and depthwise_avx2.serves(problem.in_channels, packed.data.shape[0],
                                                  plan.mode))
        wterm = depthwise_avx2.zero_point_term(packed.data, xzp_u) if in_registers else None

        def launch_dw_portable(x: np.ndarray, y: np.ndarray) -> None:
            xs = x.view(np.uint8) ^ np.uint8(flip) if flip else x.view(np.uint8)
            if in_registers and y.itemsize == 1 and y.strides[1] == 1:
                threads = get_num_threads()
                if threads == 1 or y.size * packed.kc < depthwise_avx2.SERIAL_MAX_MACS:
                    depthwise_avx2.conv_depthwise_avx2_serial(xs, xzp_u, packed.data, wterm,
                                                              geo, *tail, y)
                else:
                    depthwise_avx2.conv_depthwise_avx2(xs, xzp_u, packed.data, wterm, geo,
                                                       *tail, y, 4 * threads)
            else:
                depthwise_kernels.conv_depthwise(xs, xzp_u, packed.data, geo, *tail, y)
        return _with_residual(launch_dw_portable)
    if path == "portable":
        def launch_portable(x: np.ndarray, y: np.ndarray) -> None:
            kernels.conv_portable(x.view(np.uint8), flip, xzp_u, packed.data, geo, groups,
                                  *tail, y)
        return _with_residual(launch_portable)
    col_term = (packed.kc * xzp_u * packed.wzp - xzp_u * packed.col_sum).astype(np.int32)
    dense = (flip, xzp_u, packed.data, packed.wzp.astype(np.int32), col_term, geo, groups,
             packed.kc, packed.kc4, packed.nb)
    lda = packed.kc4 * 4
    if path == "amx":
        direct = _in_place(problem, 64) and flip == 0

        def launch_amx(x: np.ndarray, y: np.ndarray) -> None:
            prows = kernels.panel_rows(y.shape[0], lda, get_num_threads(), 32)
            kernels.conv_amx(x.view(np.uint8), *dense, direct, prows, _TILE_CONFIG, *tail, y)
        return _with_residual(launch_amx)
    direct = _in_place(problem, 4) and flip == 0
    pad = np.zeros(kernels.NR, np.int32)  # whole 16-lane loads past O (see conv_vnni)
    dense = (*dense[:3], np.concatenate([dense[3], pad]), np.concatenate([dense[4], pad]),
             *dense[5:])
    tail = (plan.mode, np.concatenate([rq.multiplier, pad.view(np.float32)]),
            np.concatenate([bias_f, pad.view(np.float32)]) if plan.mode == 0 else bias_f,
            np.concatenate([bias_i, pad]) if plan.mode == 1 else bias_i, *tail[4:])

    if _implicit(problem, flip, plan.mode, packed.wzp):
        nrows = problem.batch * problem.out_size[0]
        taps_w = _channels_to_4(packed, w, problem, plan.w_zero_point)

        def launch_taps(x: np.ndarray, y: np.ndarray, res: Residual = _NO_RESIDUAL) -> None:
            threads = get_num_threads()
            if y.strides[1] != 1:
                launch(x, y, res)
                return
            parts = threads if packed.nb >= threads and nrows < 8 * threads else 1
            kernels.conv_vnni_taps(x.view(np.uint8), xzp_u, taps_w.data, dense[4], geo,
                                   taps_w.kc4, packed.nb, parts, tail[1],
                                   tail[2] if plan.mode == 0 else tail[3], rq.zero_point,
                                   rq.lo, rq.hi, y, *res)

    def launch(x: np.ndarray, y: np.ndarray, res: Residual = _NO_RESIDUAL) -> None:
        prows, parts = kernels.work_split(y.shape[0], lda, y.shape[1] // groups,
                                          get_num_threads())
        kernels.conv_vnni(x.view(np.uint8) if flip else x, *dense, direct, prows, parts,
                          kernels.KC4_BLOCK, *tail,
                          y, *res)

    if _implicit(problem, flip, plan.mode, packed.wzp):
        return launch_taps
    return launch
