"""Engines: ways to execute a graph, each with a conv algorithm.

- ``fused``: the conv runs in output tiles (row blocks of an image, or a few whole
  images) and the whole pointwise chain is applied to each tile while it is in
  cache, written once into the output. Tiles run in parallel, one per thread at a
  time, each thread with serial numba kernels and single-threaded BLAS (as oneDNN
  runs a conv and its post-ops per thread), so no thread waits on another between
  the conv and the epilogue. Serves conv_fprop / conv_dgrad chains.
- ``partly_fused``: the conv runs whole; the chain is then applied in place over
  its output (one buffer, one extra pass per op, no intermediates).
- ``unfused``: every op is a separate kernel that materialises its result; any
  valid graph, the fallback that always works.
- ``kernel_fused``: int8 only, PyTorch's cuDNN recipe (``[bias] [relu] requantize``)
  done by the int8 kernels' own epilogue as each register block is stored.

All values inside are channels-last; ``epilogue.apply`` does every pointwise op, so
the engines differ only in where the data lives, never in the arithmetic.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np

from .. import host_params, nan_rule, registry
from ..errors import ConvSetupError
from ..problem import ConvProblem
from ..threads import get_num_threads, run_parallel, single_threaded_blas
from . import epilogue
from .ir import QUANT_DTYPES, REDUCED_DTYPES, Node
from .program import Chain, Program, TensorSpec

ENGINES = ("fused", "partly_fused", "unfused")  # every graph kind
KERNEL_FUSED = "kernel_fused"  # int8 chains only: the epilogue inside the kernel's store
INT_ALGO = "int8_exact"
TILE_BYTES = host_params.fused_tile_bytes()  # fused tiles: one core's L2 (1 MiB on Zen 4)
MIN_TILE_PIXELS = 64  # ... but never fewer output pixels (GEMM efficiency, weight reuse)
TILES_PER_THREAD = 2  # ... and enough tiles to keep every thread busy

Values = dict[str, np.ndarray]
Runner = Callable[[Values], Values]


@dataclass(frozen=True)
class Candidate:
    engine: str
    algo: str

    @property
    def name(self) -> str:
        return f"{self.engine}[{self.algo}]"


# ---------------------------------------------------------------- layout and dtype


def internal(a: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """User layout -> channels-last view (no copy, no dtype change)."""
    return np.moveaxis(a, 1, -1) if spec.layout == "NCHW" else a


def external(a: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Channels-last -> user layout view."""
    return np.moveaxis(a, -1, 1) if spec.layout == "NCHW" else a


def value(prog: Program, vals: Values, name: str) -> np.ndarray:
    """A tensor's value channels-last: graph inputs are held in the user's layout,
    op outputs channels-last."""
    spec = prog.tensors[name]
    return vals[name] if spec.virtual else internal(vals[name], spec)


def operand(prog: Program, vals: Values, op: str, name: str, main: str) -> np.ndarray:
    """Side operand ``name`` as a channels-last array broadcastable against ``main``:
    numpy broadcasting in the user's layout, then the same axis move as ``main``
    (a ``bias`` (C,) already broadcasts along the trailing channel axis)."""
    spec, mspec = prog.tensors[name], prog.tensors[main]
    a = external(vals[name], spec) if spec.virtual else vals[name]
    a = a.astype(epilogue.carrier_dtype(prog.compute_dtype), copy=False)
    if op == "bias":
        return a
    a = a.reshape((1,) * (len(mspec.shape) - a.ndim) + a.shape)
    return internal(a, mspec)


def conv_operand(a: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """C-contiguous, in the compute dtype for float convs; 8-bit data kept as is."""
    if problem.dtype == "int8":
        return np.ascontiguousarray(a)
    return np.ascontiguousarray(a, problem.compute_dtype)


def run_conv(problem: ConvProblem, algo: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One conv pass on channels-last operands -> channels-last result."""
    a, b = conv_operand(a, problem), conv_operand(b, problem)
    if problem.dtype == "int8":
        from .qnum import int8_conv

        return int8_conv(problem, a, b)
    if problem.batch == 0:
        return np.zeros(result_shape_cl(problem), problem.compute_dtype)
    algorithm = registry.get(algo, problem.pass_)
    out = algorithm.run(problem, a, b)
    if nan_rule.must_recompute(problem, algorithm, b, out):  # one NaN rule, as in the API
        with np.errstate(invalid="ignore", over="ignore"):
            out = nan_rule.reference(problem).run(problem, a, b)
    return out


def result_shape_cl(problem: ConvProblem) -> tuple[int, ...]:
    """Channels-last shape of what the problem's pass returns."""
    return {"forward": problem.y_shape, "backward_data": problem.x_shape,
            "backward_weight": problem.w_shape}[problem.pass_]("NHWC")


def algo_refusal(problem: ConvProblem, algo: str, deterministic: bool, reduced: bool) -> str | None:
    """Why ``algo`` cannot run ``problem`` under the flags, or None."""
    if problem.dtype == "int8":
        if algo != INT_ALGO:
            return f"{algo!r} is a float algorithm; the int8 conv runs {INT_ALGO!r}"
        from .qnum import int8_conv_refusal

        return int8_conv_refusal(problem)
    if algo == INT_ALGO:
        return f"{INT_ALGO!r} serves int8 convs only"
    a = registry.get(algo, problem.pass_)
    if deterministic and not a.deterministic:
        return f"{algo!r} is not deterministic (deterministic=True)"
    if (deterministic or not reduced) and not a.exact:
        return (f"{algo!r} is reduced precision "
                f"(deterministic=True or allow_reduced_precision=False)")
    return a.supports(problem)


# ---------------------------------------------------------------- the engines


class Built:
    """What an engine returns for a program: the runner and its workspace."""

    def __init__(self, run: Runner, workspace_bytes: int) -> None:
        self.run = run
        self.workspace_bytes = workspace_bytes


def build(cand: Candidate, prog: Program, deterministic: bool, reduced: bool) -> Built | str:
    """Build ``cand`` for ``prog``: a :class:`Built`, or the reason it refuses."""
    if prog.compute_dtype in REDUCED_DTYPES and not reduced:
        return (f"compute_dtype {prog.compute_dtype} is reduced precision "
                f"(pass allow_reduced_precision=True)")
    if deterministic and prog.compute_dtype in REDUCED_DTYPES:
        return f"compute_dtype {prog.compute_dtype} is reduced precision (deterministic=True)"
    for node in prog.convs:
        why = algo_refusal(prog.problems[node.name], cand.algo, deterministic, reduced)
        if why is not None:
            return f"conv {node.name!r}: {why}"
    if cand.engine == "unfused":
        return _unfused(prog, cand.algo)
    chain = prog.chain()
    if isinstance(chain, str):
        return chain
    if cand.engine == "partly_fused":
        return _partly_fused(prog, chain, cand.algo)
    if cand.engine == KERNEL_FUSED:
        return _kernel_fused(prog, chain)
    return _fused(prog, chain, cand.algo, deterministic, reduced)


def _carrier(prog: Program) -> np.dtype:
    return epilogue.carrier_dtype(prog.compute_dtype)


def _out_dtype(prog: Program, node: Node) -> np.dtype:
    spec = prog.tensors[node.output]
    if spec.dtype in QUANT_DTYPES or spec.dtype == "int32":
        return np.dtype(spec.dtype)
    return _carrier(prog)


def _run_node(prog: Program, node: Node, algo: str, vals: Values) -> np.ndarray:
    """One op as its own kernel, materialising its result."""
    if node.op in ("conv_fprop", "conv_dgrad", "conv_wgrad"):
        first, second = (value(prog, vals, n) for n in node.inputs)
        return run_conv(prog.problems[node.name], algo, first, second)
    a = value(prog, vals, node.inputs[0])
    b: np.ndarray | None = None
    if len(node.inputs) > 1:
        b = operand(prog, vals, node.op, node.inputs[1], node.inputs[0])
    a = a if a.dtype == np.int32 else a.astype(_carrier(prog), copy=False)
    out = np.empty(a.shape, _out_dtype(prog, node))
    return epilogue.apply(node.op, node.attrs, a, b, out, prog.compute_dtype)


def _unfused(prog: Program, algo: str) -> Built:
    space = sum(
        math.prod(prog.tensors[n.output].shape) * _out_dtype(prog, n).itemsize
        for n in prog.nodes
    )

    def run(vals: Values) -> Values:
        vals = dict(vals)
        for node in prog.nodes:
            vals[node.output] = _run_node(prog, node, algo, vals)
        return {n: _deliver(prog, n, vals[n]) for n in prog.outputs}

    return Built(run, space)


def _prologue(prog: Program, chain: Chain, algo: str, vals: Values) -> tuple[Values, list]:
    """Run the prologue ops; return the values and the chain's side operands."""
    vals = dict(vals)
    for node in chain.prologue:
        vals[node.output] = _run_node(prog, node, algo, vals)
    ops = [
        None if name is None else operand(prog, vals, node.op, name, chain.conv.output)
        for node, name in zip(chain.ops, chain.operands, strict=True)
    ]
    return vals, ops


def _apply_chain(prog: Program, chain: Chain, y: np.ndarray, ops: list, index: tuple,
                 out: np.ndarray) -> None:
    """Apply the chain to conv result ``y`` (a tile at ``index``), in place where the
    dtypes allow, the last op writing ``out``."""
    cur = y
    for k, (node, b) in enumerate(zip(chain.ops, ops, strict=True)):
        if b is not None:
            b = b[_tile_index(b, y.ndim, index)]
        last = k == len(chain.ops) - 1
        if last and out.dtype == _out_dtype(prog, node):
            dest = out
        elif cur.dtype == _out_dtype(prog, node):
            dest = cur
        else:
            dest = np.empty(cur.shape, _out_dtype(prog, node))
        cur = epilogue.apply(node.op, node.attrs, cur, b, dest, prog.compute_dtype)
    if cur is not out:
        np.copyto(out, cur, casting="unsafe")


def _tile_index(b: np.ndarray, rank: int, index: tuple[slice, ...]) -> tuple[slice, ...]:
    """The part of operand ``b`` (broadcast against a rank-``rank`` value, trailing
    dims aligned) that meets the tile ``index`` of the leading dims."""
    lead = rank - b.ndim
    return tuple(
        s if i >= lead and b.shape[i - lead] != 1 else slice(None)
        for i, s in enumerate(index) if i >= lead
    )


def _deliver(prog: Program, name: str, a: np.ndarray) -> np.ndarray:
    """A channels-last op output -> the user's layout and delivered dtype."""
    arr, out = _result(prog, name)
    np.copyto(out, a, casting="unsafe")
    return arr


def _result(prog: Program, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The user-layout output array and its channels-last view."""
    spec = prog.tensors[name]
    arr = np.empty(spec.shape, prog.delivered_dtype(name))
    return arr, internal(arr, spec)


def _value_bytes(prog: Program, problem: ConvProblem) -> int:
    """Bytes per conv output value: the conv's result, plus a buffer in the carrier
    dtype when that differs (an int32 accumulator, or float32 data computed in float64)."""
    conv = np.dtype(np.int32) if problem.dtype == "int8" else problem.compute_dtype
    return conv.itemsize + (_carrier(prog).itemsize if conv != _carrier(prog) else 0)


def _partly_fused(prog: Program, chain: Chain, algo: str) -> Built:
    problem = prog.problems[chain.conv.name]
    out_name = prog.outputs[0]
    size = math.prod(prog.tensors[chain.conv.output].shape)
    space = size * _value_bytes(prog, problem)
    if problem.dtype != "int8":
        space += registry.get(algo, problem.pass_).workspace_bytes(problem)

    def run(vals: Values) -> Values:
        vals, ops = _prologue(prog, chain, algo, vals)
        a, b = (value(prog, vals, n) for n in chain.conv.inputs)
        y = run_conv(problem, algo, a, b)
        arr, out = _result(prog, out_name)
        _apply_chain(prog, chain, y, ops, (), out)
        return {out_name: arr}

    return Built(run, space)


@dataclass(frozen=True)
class Tile:
    problem: ConvProblem
    src: tuple[slice, ...]  # into the conv's first operand (x or dy)
    dst: tuple[slice, ...]  # into the channels-last output


def tiles(problem: ConvProblem, threads: int = 1) -> list[Tile]:
    """Output tiles of at most about TILE_BYTES, and at least TILES_PER_THREAD per
    thread where MIN_TILE_PIXELS allows: a few whole images, or row blocks of one.

    Every ``src`` slice of a C-contiguous channels-last operand stays contiguous.
    """
    if problem.pass_ == "backward_data":
        per_pixel, rows, row_pixels = problem.in_channels, 1, math.prod(problem.in_size)
    else:
        rows = problem.out_size[0]
        per_pixel, row_pixels = problem.out_channels, math.prod(problem.out_size[1:])
    image = rows * row_pixels
    share = -(-problem.batch * image // (TILES_PER_THREAD * threads))
    pixels = max(MIN_TILE_PIXELS, min(TILE_BYTES // (4 * per_pixel), share))
    out = []
    if pixels >= image or problem.pass_ == "backward_data":
        step = max(1, pixels // image)
        for n0 in range(0, problem.batch, step):
            n1 = min(n0 + step, problem.batch)
            sub = dataclasses.replace(problem, batch=n1 - n0)
            out.append(Tile(sub, (slice(n0, n1),), (slice(n0, n1),)))
        return out
    step = max(1, pixels // row_pixels)
    (lo, _), s, k = problem.padding[0], problem.stride[0], problem.effective_kernel[0]
    height = problem.in_size[0]
    for n in range(problem.batch):
        for r0 in range(0, rows, step):
            r1 = min(r0 + step, rows)
            start, end = r0 * s - lo, (r1 - 1) * s + k - lo
            i0, i1 = max(start, 0), min(end, height)
            sub = dataclasses.replace(
                problem, batch=1, in_size=(i1 - i0, *problem.in_size[1:]),
                out_size=(r1 - r0, *problem.out_size[1:]),
                padding=((i0 - start, end - i1), *problem.padding[1:]))
            out.append(Tile(sub, (slice(n, n + 1), slice(i0, i1)),
                            (slice(n, n + 1), slice(r0, r1))))
    return out


def _fused(prog: Program, chain: Chain, algo: str, deterministic: bool,
           reduced: bool) -> Built | str:
    problem = prog.problems[chain.conv.name]
    if problem.pass_ == "backward_weight":
        return "conv_wgrad reduces over the batch: its output has no independent tiles"
    plan = tiles(problem, get_num_threads())
    for sub in {t.problem for t in plan}:
        if min(sub.in_size) < 1:
            return f"a tile of {problem.describe()} would read only padding"
        why = algo_refusal(sub, algo, deterministic, reduced)
        if why is not None:
            return f"tile {sub.describe()}: {why}"
    out_name = prog.outputs[0]
    space = 0
    if plan:
        tile_size = max(math.prod(t.problem.result_shape()) for t in plan)
        space = tile_size * _value_bytes(prog, problem)
    if problem.dtype != "int8" and plan:
        space += max(registry.get(algo, problem.pass_).workspace_bytes(t.problem) for t in plan)

    def run(vals: Values) -> Values:
        vals, ops = _prologue(prog, chain, algo, vals)
        a, b = (value(prog, vals, n) for n in chain.conv.inputs)
        a, b = conv_operand(a, problem), conv_operand(b, problem)
        arr, out = _result(prog, out_name)
        counter = itertools.count()  # tiles are handed out one by one (atomic next)

        def work(part: int, parts: int) -> None:
            saved = numba.get_num_threads()
            numba.set_num_threads(1)  # thread-local: this thread's kernels run serially
            try:
                while (i := next(counter)) < len(plan):
                    t = plan[i]
                    y = run_conv(t.problem, algo, a[t.src], b)
                    _apply_chain(prog, chain, y, ops, t.dst, out[t.dst])
            finally:
                numba.set_num_threads(saved)

        with single_threaded_blas():
            run_parallel(work, min(get_num_threads(), len(plan)))
        return {out_name: arr}

    return Built(run, space)


def _kernel_fused(prog: Program, chain: Chain) -> Built | str:
    """cuDNN's quantized recipe, ``[bias] [relu] requantize`` after an int8 conv,
    computed by the quant kernels' own epilogue as each register block is stored."""
    problem = prog.problems[chain.conv.name]
    if problem.dtype != "int8":
        return f"{KERNEL_FUSED} serves int8 convs only"
    ops = tuple(n.op for n in chain.ops)
    if ops not in (("requantize",), ("relu", "requantize"), ("bias", "requantize"),
                   ("bias", "relu", "requantize")):
        return f"{KERNEL_FUSED} needs the chain [bias] [relu] requantize, got {list(ops)}"
    from .qnum import int8_conv_requant

    requant, out_name = chain.ops[-1].attrs, prog.outputs[0]
    nchw = prog.tensors[out_name].layout == "NCHW"
    space = math.prod(prog.tensors[out_name].shape) if nchw else 0

    def run(vals: Values) -> Values:
        vals, operands = _prologue(prog, chain, INT_ALGO, vals)
        x, w = (conv_operand(value(prog, vals, n), problem) for n in chain.conv.inputs)
        arr, out = _result(prog, out_name)
        dest = np.empty(out.shape, out.dtype) if nchw else out
        int8_conv_requant(problem, x, w, operands[0] if ops[0] == "bias" else None,
                          requant["scale"], requant["zero_point"], "relu" in ops, dest)
        if nchw:
            np.copyto(out, dest)
        return {out_name: arr}

    return Built(run, space)


def check_input(name: str, arr: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Shape, dtype and alignment of a bound input (kept in the user's layout)."""
    if tuple(arr.shape) != spec.shape:
        raise ConvSetupError(f"input {name!r} has shape {tuple(arr.shape)}, "
                             f"expected {spec.shape} (as declared in the graph)")
    if arr.dtype.name != spec.dtype:
        raise ConvSetupError(f"input {name!r} has dtype {arr.dtype.name}, "
                             f"expected {spec.dtype} (as declared in the graph)")
    if arr.size and arr.ctypes.data % spec.alignment:
        raise ConvSetupError(
            f"input {name!r} is not {spec.alignment}-byte aligned (the plan was built for "
            f"alignment={spec.alignment}); pass a copy or declare a smaller alignment")
    return arr
