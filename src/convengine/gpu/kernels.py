"""The Triton kernels: implicit GEMM (forward and backward-data, tensor cores via
``tl.dot``), its backward-weight GEMM, and the direct kernels for groups/depthwise.

Every operand is canonical: activations ``(N, D, H, W, C)``, weights
``(O, KD, KH, KW, C // g)``, C-contiguous (1-D and 2-D problems carry unit dims in
front). One coordinate rule serves forward and backward-data: for output position
``p`` and tap ``k`` the activation index along a dim is ``t = p * S + P + k * DL``,
read where ``t % V == 0`` and ``0 <= t // V < A`` (forward: ``S = stride``,
``P = -pad``, ``DL = dilation``, ``V = 1``; backward-data: ``S = 1``, ``P = pad``,
``DL = -dilation``, ``V = stride``).

Epilogues (``EPI``, an :class:`~convengine.epilogue_codes.Epilogue`): FLOAT (bias,
activation ``ACT``, an :class:`~convengine.epilogue_codes.Activation` of ``GPU``: none,
relu, silu, gelu), REQUANT_FLOAT int8 requantization in float32 (PyTorch),
REQUANT_INT32 in float64 with an int32 bias (ONNX), RAW the int32 accumulator plus an
int32 bias (ConvInteger): the codes of the CPU kernels. The float steps are those
of :mod:`convengine.quant.numerics`; launches pass ``enable_fp_fusion=False`` so that
no multiply and add fuse into an FMA, and rounding is half to even by the 1.5 * 2^mantissa
trick (exact on the clamped range).

``DOT_F32`` upcasts the ``tl.dot`` operands to float32 first: the interpreter multiplies
bfloat16 as raw 16-bit integers, so bfloat16 runs there set it (exact products, the
same float32 accumulation); GPUs run the bfloat16 tensor-core dot.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..epilogue_codes import Activation, Epilogue

RINT32 = tl.constexpr(12582912.0)  # 1.5 * 2**23: (v + RINT32) - RINT32 rounds |v| < 2**22 half to even
RINT64 = tl.constexpr(6755399441055744.0)  # 1.5 * 2**52
# the shared codes as constexprs (jitted code reads module globals only as those)
RELU, SILU, GELU = (tl.constexpr(int(a)) for a in (Activation.RELU, Activation.SILU,
                                                    Activation.GELU))
FLOAT, REQUANT_FLOAT, REQUANT_INT32 = (tl.constexpr(int(e)) for e in (
    Epilogue.FLOAT, Epilogue.REQUANT_FLOAT, Epilogue.REQUANT_INT32))


@triton.jit
def _coord(p, k, S, P, DL, V, A):
    """Activation index along one dim and whether it is read (see the module docstring)."""
    t = p * S + P + k * DL
    ok = (t >= 0) & (t % V == 0)
    i = t // V
    return i, ok & (i < A)


@triton.jit
def _position(p, PD, PH, PW):
    """Flat output positions ``p`` of ``(N, PD, PH, PW)`` -> (n, pd, ph, pw)."""
    pw = p % PW
    t = p // PW
    ph = t % PH
    t = t // PH
    return t // PD, t % PD, ph, pw


@triton.jit
def _taps(tap, KH, KW):
    """Flat tap indices of ``(KD, KH, KW)`` -> (kd, kh, kw)."""
    return tap // (KW * KH), (tap // KW) % KH, tap % KW


@triton.jit
def _source(n, pd, ph, pw, kd, kh, kw, AD, AH, AW, SD, SH, SW, PAD_D, PAD_H, PAD_W,
            DLD, DLH, DLW, VD, VH, VW):
    """The activation pixel output position (n, pd, ph, pw) reads at tap (kd, kh, kw):
    its flat index into ``(N, AD, AH, AW)`` (int64) and whether it is read (see
    :func:`_coord`)."""
    i_d, ok_d = _coord(pd, kd, SD, PAD_D, DLD, VD, AD)
    i_h, ok_h = _coord(ph, kh, SH, PAD_H, DLH, VH, AH)
    i_w, ok_w = _coord(pw, kw, SW, PAD_W, DLW, VW, AW)
    return (((n * AD + i_d) * AH + i_h) * AW + i_w).to(tl.int64), ok_d & ok_h & ok_w


@triton.jit
def _dot(acc, a, b, TF32: tl.constexpr, DOT_F32: tl.constexpr):
    """acc + a @ b in float32: TF32 tensor cores or IEEE products (``DOT_F32``: see the
    module docstring)."""
    if DOT_F32:
        a, b = a.to(tl.float32), b.to(tl.float32)
    if TF32:
        acc += tl.dot(a, b, input_precision="tf32")
    else:
        acc += tl.dot(a, b, input_precision="ieee")
    return acc


@triton.jit
def _epilogue(acc, rq, rows, row_ok, rq_mask, bias_ptr, mult_ptr, y_ptr, Q, out_zp, lo, hi,
              HAS_BIAS: tl.constexpr, ACT: tl.constexpr, EPI: tl.constexpr):
    """Finish an accumulator tile ``acc [BM, BQ]`` (y rows ``rows``, int64, where
    ``row_ok``; channels ``rq``) into y ``[*, Q]``."""
    if EPI == FLOAT:
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + rq, mask=rq_mask, other=0.0).to(tl.float32)[None, :]
        if ACT == RELU:
            acc = tl.maximum(acc, 0.0)
        elif ACT == SILU:
            acc = acc * tl.sigmoid(acc)
        elif ACT == GELU:
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        out = acc
    elif EPI == REQUANT_FLOAT:
        bias = tl.load(bias_ptr + rq, mask=rq_mask, other=0.0)
        mult = tl.load(mult_ptr + rq, mask=rq_mask, other=0.0)
        v = (acc.to(tl.float32) + bias[None, :]) * mult[None, :]
        v = tl.minimum(tl.maximum(v, -4194304.0), 4194304.0)  # outside, any value clamps
        v = (v + RINT32) - RINT32
        v = v + out_zp
        out = tl.minimum(tl.maximum(v, lo), hi)
    elif EPI == REQUANT_INT32:
        bias = tl.load(bias_ptr + rq, mask=rq_mask, other=0)
        mult = tl.load(mult_ptr + rq, mask=rq_mask, other=0.0).to(tl.float64)
        v = (acc + bias[None, :]).to(tl.float64) * mult[None, :]
        zero = tl.zeros_like(v)  # promotes the fp32 scalars exactly to float64
        v = v + (zero + out_zp)
        v = tl.minimum(tl.maximum(v, zero + lo), zero + hi)
        out = (v + RINT64) - RINT64
    else:  # RAW
        out = acc + tl.load(bias_ptr + rq, mask=rq_mask, other=0)[None, :]
    offs = rows[:, None] * Q + rq[None, :]
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & rq_mask[None, :])


@triton.jit
def igemm_kernel(
    a_ptr, b_ptr, y_ptr, bias_ptr, mult_ptr, rsum_ptr,
    M, Q, R, AD, AH, AW, PD, PH, PW, KD, KH, KW,
    SD, SH, SW, PAD_D, PAD_H, PAD_W, DLD, DLH, DLW, VD, VH, VW,
    sb_q, sb_r, sb_tap, a_zp, out_zp, lo, hi, M_BUCKET, Q_BUCKET, K_BUCKET,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, EPI: tl.constexpr, TF32: tl.constexpr,
    DOT_F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """y ``[M, Q]`` = sum over taps and ``R`` channels of A (gathered) x B, groups == 1.

    A ``(N, AD, AH, AW, R)``; B at ``q * sb_q + r * sb_r + tap * sb_tap``. Integer
    problems (EPI not FLOAT) take int8 A and B with zero points folded: padded A reads as
    ``a_zp``, and the kernel returns ``sum(a * b) - rsum[q] * sum(a) ...`` through
    ``rsum_ptr`` (per-q ``[wzp, colsum]`` pairs, see :mod:`.quant`). ``*_BUCKET``
    are unused by the body: the autotuner's key (GEMM sizes rounded up to powers of 2)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(Q, BLOCK_N)
    group = GROUP_M * num_n  # grouped ordering: neighbouring programs share B tiles
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < Q
    n, pd, ph, pw = _position(rm, PD, PH, PW)
    if EPI == FLOAT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        asum = tl.zeros((BLOCK_M,), dtype=tl.int32)
        azp = (tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.int32) + a_zp).to(tl.int8)
    # one flat loop over (tap, channel block), so that Triton pipelines its loads
    blocks = tl.cdiv(R, BLOCK_K)
    for step in range(0, KD * KH * KW * blocks):
        tap = step // blocks
        rr = (step - tap * blocks) * BLOCK_K + rk
        kd, kh, kw = _taps(tap, KH, KW)
        row, ok = _source(n, pd, ph, pw, kd, kh, kw, AD, AH, AW, SD, SH, SW, PAD_D, PAD_H,
                          PAD_W, DLD, DLH, DLW, VD, VH, VW)
        inside = m_ok & ok
        row = row * R
        r_ok = rr < R
        a = tl.load(a_ptr + row[:, None] + rr[None, :], mask=inside[:, None] & r_ok[None, :],
                    other=0)
        b = tl.load(b_ptr + tap * sb_tap + rn[None, :] * sb_q + rr[:, None] * sb_r,
                    mask=r_ok[:, None] & n_ok[None, :], other=0)
        if EPI == FLOAT:
            acc = _dot(acc, a, b, TF32, DOT_F32)
        else:
            a = tl.where(~inside[:, None] & r_ok[None, :], azp, a)
            acc += tl.dot(a, b, out_dtype=tl.int32)
            asum += tl.sum(a.to(tl.int32), axis=1)
    if EPI != FLOAT:
        # sum (a - azp)(b - bzp) = sum ab - bzp * sum a - azp * sum b + K * azp * bzp
        bzp = tl.load(rsum_ptr + 2 * rn, mask=n_ok, other=0)
        bsum = tl.load(rsum_ptr + 2 * rn + 1, mask=n_ok, other=0)
        ktot = R * KD * KH * KW
        acc = acc - asum[:, None] * bzp[None, :] - (a_zp * bsum - ktot * a_zp * bzp)[None, :]
    _epilogue(acc, rn, rm.to(tl.int64), m_ok, n_ok, bias_ptr, mult_ptr, y_ptr, Q, out_zp,
              lo, hi,
              HAS_BIAS, ACT, EPI)


@triton.jit
def _phase_dim(tab, j, m):
    """Along one dim of a phase (table ``tab``: J, phi, k0, count, base, dstep, kstep,
    stride): the dy index of position ``j`` at tap step ``m``, and the tap."""
    base = tl.load(tab + 4)
    dstep = tl.load(tab + 5)
    return j + base - m * dstep, tl.load(tab + 2) + m * tl.load(tab + 6)


@triton.jit
def dgrad_phased_kernel(
    a_ptr, b_ptr, y_ptr, bias_ptr, tab_ptr,
    NB, Q, R, AD, AH, AW, XD, XH, XW, KH, KW, sb_q, sb_r, sb_tap,
    M_BUCKET, Q_BUCKET, K_BUCKET,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, TF32: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Backward-data at stride > 1 (groups == 1), one stride phase per program axis 1:
    the dx positions ``i = phi + stride * j`` of a phase are reached by the same taps
    (an arithmetic progression per dim), so no tap is visited in vain. ``tab_ptr``
    holds 8 ints per dim per phase (see :func:`_phase_dim`); dy ``(NB, AD, AH, AW, R)``,
    dx ``(NB, XD, XH, XW, Q)``."""
    tab = tab_ptr + tl.program_id(1) * 24
    jd_n = tl.load(tab)
    jh_n = tl.load(tab + 8)
    jw_n = tl.load(tab + 16)
    cnt_h = tl.load(tab + 11)
    cnt_w = tl.load(tab + 19)
    M = NB * jd_n * jh_n * jw_n
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < Q
    n, jd, jh, jw = _position(rm, tl.maximum(jd_n, 1), tl.maximum(jh_n, 1), tl.maximum(jw_n, 1))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    blocks = tl.cdiv(R, BLOCK_K)
    for step in range(0, tl.load(tab + 3) * cnt_h * cnt_w * blocks):
        taps = step // blocks
        rr = (step - taps * blocks) * BLOCK_K + rk
        mw = taps % cnt_w
        mh = (taps // cnt_w) % cnt_h
        td, kd = _phase_dim(tab, jd, taps // (cnt_w * cnt_h))
        th, kh = _phase_dim(tab + 8, jh, mh)
        tw, kw = _phase_dim(tab + 16, jw, mw)
        inside = m_ok & (td >= 0) & (td < AD) & (th >= 0) & (th < AH) & (tw >= 0) & (tw < AW)
        row = (((n * AD + td) * AH + th) * AW + tw).to(tl.int64) * R
        r_ok = rr < R
        a = tl.load(a_ptr + row[:, None] + rr[None, :], mask=inside[:, None] & r_ok[None, :],
                    other=0)
        tap = (kd * KH + kh) * KW + kw
        b = tl.load(b_ptr + tap * sb_tap + rn[None, :] * sb_q + rr[:, None] * sb_r,
                    mask=r_ok[:, None] & n_ok[None, :], other=0)
        acc = _dot(acc, a, b, TF32, DOT_F32)
    i_d = tl.load(tab + 1) + tl.load(tab + 7) * jd
    i_h = tl.load(tab + 9) + tl.load(tab + 15) * jh
    i_w = tl.load(tab + 17) + tl.load(tab + 23) * jw
    rows = (((n * XD + i_d) * XH + i_h) * XW + i_w).to(tl.int64)
    _epilogue(acc, rn, rows, m_ok, n_ok, bias_ptr, bias_ptr, y_ptr, Q, 0.0, 0.0, 0.0,
              HAS_BIAS, ACT, FLOAT)


@triton.jit
def direct_kernel(
    a_ptr, b_ptr, y_ptr, bias_ptr, mult_ptr, bzp_ptr,
    M, Q, R, QG, CA, AD, AH, AW, PD, PH, PW, KD, KH, KW,
    SD, SH, SW, PAD_D, PAD_H, PAD_W, DLD, DLH, DLW, VD, VH, VW,
    sb_q, sb_g, sb_r, sb_tap, a_zp, out_zp, lo, hi,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, EPI: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grouped conv, no tensor cores: y ``[M, Q]``, channel q in group ``g = q // QG``
    sums ``R`` channels ``g * R + r`` of A ``(N, AD, AH, AW, CA)`` times B at
    ``q * sb_q + g * sb_g + r * sb_r + tap * sb_tap``, fp32 (or exact int32 with zero
    points subtracted) FMAs over a ``[BLOCK_M, BLOCK_N]`` tile."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < Q
    g = rn // QG
    n, pd, ph, pw = _position(rm, PD, PH, PW)
    if EPI == FLOAT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        bzp = tl.load(bzp_ptr + rn, mask=n_ok, other=0)
    b_q = b_ptr + rn * sb_q + g * sb_g
    for kd in range(KD):
        i_d, ok_d = _coord(pd, kd, SD, PAD_D, DLD, VD, AD)
        for kh in range(KH):
            i_h, ok_h = _coord(ph, kh, SH, PAD_H, DLH, VH, AH)
            for kw in range(KW):
                i_w, ok_w = _coord(pw, kw, SW, PAD_W, DLW, VW, AW)
                inside = m_ok & ok_d & ok_h & ok_w
                row = (((n * AD + i_d) * AH + i_h) * AW + i_w).to(tl.int64) * CA
                tap = (kd * KH + kh) * KW + kw
                mask = inside[:, None] & n_ok[None, :]
                for r in range(R):
                    a_offs = row[:, None] + (g * R + r)[None, :]
                    b = tl.load(b_q + r * sb_r + tap * sb_tap, mask=n_ok, other=0)
                    if EPI == FLOAT:
                        a = tl.load(a_ptr + a_offs, mask=mask, other=0.0)
                        acc += a.to(tl.float32) * b.to(tl.float32)[None, :]
                    else:
                        a = tl.load(a_ptr + a_offs, mask=mask, other=a_zp)
                        acc += (a.to(tl.int32) - a_zp) * (b.to(tl.int32) - bzp)[None, :]
    _epilogue(acc, rn, rm.to(tl.int64), m_ok, n_ok, bias_ptr, mult_ptr, y_ptr, Q, out_zp,
              lo, hi,
              HAS_BIAS, ACT, EPI)


@triton.jit
def wgrad_kernel(
    x_ptr, dy_ptr, dw_ptr, P, NO, C, T, SPLIT, XD, XH, XW, PD, PH, PW, KH, KW,
    SD, SH, SW, PAD_D, PAD_H, PAD_W, DLD, DLH, DLW, TF32: tl.constexpr,
    DOT_F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """dw ``(SPLIT, NO, T, C)`` [s, o, tap, c] = sum over the s-th of ``SPLIT`` runs of
    the ``P`` output positions of dy[p, o] * x[in(p, tap), c], groups == 1; program
    axis 2 is (tap, s). With SPLIT > 1 the caller sums the partial dw (deterministic)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tap = tl.program_id(2) // SPLIT
    part = tl.program_id(2) % SPLIT
    chunk = tl.cdiv(tl.cdiv(P, BLOCK_K), SPLIT) * BLOCK_K
    p_end = tl.minimum(P, (part + 1) * chunk)
    kd, kh, kw = _taps(tap, KH, KW)
    rk = tl.arange(0, BLOCK_K)
    o_ok = rm < NO
    c_ok = rn < C
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for p0 in range(part * chunk, p_end, BLOCK_K):
        p = p0 + rk
        n, pd, ph, pw = _position(p, PD, PH, PW)
        row, ok = _source(n, pd, ph, pw, kd, kh, kw, XD, XH, XW, SD, SH, SW, PAD_D, PAD_H,
                          PAD_W, DLD, DLH, DLW, 1, 1, 1)
        inside = (p < p_end) & ok
        row = row * C
        dyt = tl.load(dy_ptr + p.to(tl.int64)[None, :] * NO + rm[:, None],
                      mask=(p < p_end)[None, :] & o_ok[:, None], other=0)
        xt = tl.load(x_ptr + row[:, None] + rn[None, :], mask=inside[:, None] & c_ok[None, :],
                     other=0)
        acc = _dot(acc, dyt, xt, TF32, DOT_F32)
    offs = ((part * NO + rm[:, None]) * T + tap).to(tl.int64) * C + rn[None, :]
    tl.store(dw_ptr + offs, acc.to(dw_ptr.dtype.element_ty), mask=o_ok[:, None] & c_ok[None, :])


@triton.jit
def wgrad_direct_kernel(
    x_ptr, dy_ptr, dw_ptr, P, NO, OG, CG, C, T, XD, XH, XW, PD, PH, PW, KH, KW,
    SD, SH, SW, PAD_D, PAD_H, PAD_W, DLD, DLH, DLW,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grouped dw ``(NO, T, CG)``: each program sums over all positions for BLOCK_N
    flattened (o, r) pairs of one tap (program axis 1), fp32 FMAs."""
    q = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tap = tl.program_id(1)
    kd, kh, kw = _taps(tap, KH, KW)
    q_ok = q < NO * CG
    o = q // CG
    c = (o // OG) * CG + q % CG
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        n, pd, ph, pw = _position(p, PD, PH, PW)
        row, ok = _source(n, pd, ph, pw, kd, kh, kw, XD, XH, XW, SD, SH, SW, PAD_D, PAD_H,
                          PAD_W, DLD, DLH, DLW, 1, 1, 1)
        inside = (p < P) & ok
        row = row * C
        dy = tl.load(dy_ptr + p.to(tl.int64)[:, None] * NO + o[None, :],
                     mask=(p < P)[:, None] & q_ok[None, :], other=0.0)
        x = tl.load(x_ptr + row[:, None] + c[None, :], mask=inside[:, None] & q_ok[None, :],
                    other=0.0)
        acc += dy.to(tl.float32) * x.to(tl.float32)
    dw = tl.sum(acc, axis=0)
    tl.store(dw_ptr + (o * T + tap) * CG + q % CG, dw.to(dw_ptr.dtype.element_ty), mask=q_ok)
