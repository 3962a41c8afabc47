"""``Session``: a prepared ONNX model, run many times (like ONNX Runtime's
``InferenceSession``).

Preparing checks the model first (:mod:`.validate`: a malformed, truncated or hostile
file is a ConvSetupError naming the file, the node or the field, before anything is
allocated from a declared size), checks every op up front, converts initializers and
Constant nodes once,
folds every node whose inputs are all constants, rewrites QDQ convs
(DequantizeLinear -> Conv [-> Relu] -> QuantizeLinear) into int8 QLinearConv and QDQ
Add / GlobalAveragePool / MaxPool / Flatten / Reshape / Gemm into int8 forms, folds
BatchNormalization into the preceding conv, fuses Conv + [Add] + activation into one
step, prepares each conv with constant weights once (:class:`ConvStep`: packed for
the algorithm convengine's heuristic picks, bias + residual + activation in one compiled pass;
:class:`QConvStep`: int8 plan and packed weights bound, ReLU in the requantization,
a QLinearAdd that alone reads the conv's output in the conv's kernel;
QGemm through the int8 kernels) and lists when each tensor can be freed. Activations
stay channels-last through the graph: convs, QuantizeLinear, MaxPool and QLinearAdd
return NCHW views of NHWC memory that the next step reads without a copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConvSetupError
from ..threads import get_num_threads, note_active, set_num_threads, wake_after_idle
from . import proto
from .convstep import ConvStep, GemmStep, gemm_step
from .ops import (
    OPS,
    OPSET_DEPENDENT,
    SINGLE_OUTPUT,
    Array,
    Op,
    check_rank,
    conv_args,
    to_first,
    to_last,
)
from .qconvstep import QConvStep
from .qops import MICROSOFT_OPS, QOPS, qgemm, qgemm_output, qgemm_weight
from .validate import (
    check_graph,
    check_text,
    load,
    parse_nodes,
    source_name,
    tensor_array,
)

if TYPE_CHECKING:  # annotations only: the messages are read through .proto, not onnx
    import onnx

DOMAINS: dict[str, dict[str, Op]] = {"": {**OPS, **QOPS}, "com.microsoft": MICROSOFT_OPS}


def register_op(op_type: str, fn: Op, domain: str = "") -> None:
    """Add or replace an operator: ``fn(inputs, attrs) -> [outputs]`` with NCHW
    semantics (inputs in ``node.input`` order, None for omitted optional ones)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    DOMAINS.setdefault("" if domain == "ai.onnx" else domain, {})[op_type] = fn


def lookup(domain: str, op_type: str) -> Op | None:
    return DOMAINS.get("" if domain == "ai.onnx" else domain, {}).get(op_type)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: name, ONNX type string (``tensor(float)``) and shape
    (ints, symbolic names, or None for unknown dims)."""

    name: str
    type: str
    shape: list[int | str | None]
    dtype: np.dtype | None


def _info(value: onnx.ValueInfoProto, what: str) -> TensorInfo:
    t = value.type.tensor_type
    dtype = None
    try:
        if t.elem_type:
            dtype = proto.np_dtype(t.elem_type)
        type_name = proto.type_name(t.elem_type).lower() if t.elem_type else "?"
    except (KeyError, ValueError):
        raise ConvSetupError(f"{what} {value.name!r}: elem_type {t.elem_type} is not an "
                             f"ONNX tensor type") from None
    shape: list[int | str | None] = []
    if t.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in t.shape.dim]
    return TensorInfo(value.name, f"tensor({type_name})", shape, dtype)


@dataclasses.dataclass
class _Node:
    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]


def _named(node: _Node | None, error: Exception, source: str | None = None) -> Exception:
    """The same kind of error, its message prefixed with the node and the model file
    (numpy's AxisError, an input of the wrong rank, as a ConvSetupError)."""
    message = f"node {node.name!r} ({node.op_type}): {error}" if node is not None \
        else str(error)
    if source is not None:
        message = f"ONNX model {source}: {message}"
    kind = ConvSetupError if isinstance(error, np.exceptions.AxisError) else type(error) \
        if isinstance(error, (ValueError, TypeError, NotImplementedError)) else RuntimeError
    try:
        return kind(message)
    except TypeError:
        return RuntimeError(message)


def _allclose(a: Array, b: Array) -> bool:
    """np.allclose (rtol 1e-6), False where the shapes do not broadcast."""
    try:
        np.broadcast_shapes(np.shape(a), np.shape(b))
    except ValueError:
        return False
    return bool(np.allclose(a, b, rtol=1e-6, atol=0))


@contextlib.contextmanager
def _naming(node: _Node) -> Iterator[None]:
    """An error inside names ``node`` (a rewrite's or a compile's)."""
    try:
        yield
    except Exception as error:
        if f"node {node.name!r}" in str(error):
            raise
        raise _named(node, error) from error


# ------------------------------------------------------------------ epilogues


def _epilogue_step(node: _Node, consts: Mapping[str, Array]) -> tuple[str, Any] | None:
    """The in-place form of an activation node, or None if it has none."""
    op, a = node.op_type, node.attrs
    if op == "Relu":
        return ("relu", None)
    if op == "Clip":
        bounds = []
        for i, key in ((1, "min"), (2, "max")):
            name = node.inputs[i] if len(node.inputs) > i else ""
            if name and name not in consts:
                return None
            bounds.append(consts[name] if name else a.get(key))
        return ("clip", tuple(bounds))
    if op == "LeakyRelu":
        return ("leaky", float(a.get("alpha", 0.01)))
    if op in ("Sigmoid", "HardSwish"):
        return (op.lower(), None)
    if op == "HardSigmoid":
        return ("hardsigmoid", (float(a.get("alpha", 0.2)), float(a.get("beta", 0.5))))
    return None


# ------------------------------------------------------------------ the session


class Session:
    """A prepared ONNX model. ``Session(model_or_path_or_bytes, *, threads=None)``;
    ``run(output_names, {input_name: array})`` returns the outputs in the order asked
    (all graph outputs for ``None``); ``threads`` sets convengine's thread count while
    running (None leaves it)."""

    def __init__(self, model: Any, *, threads: int | None = None) -> None:
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise ValueError(f"threads must be a positive int or None, got {threads!r}")
        self.threads = threads
        self._source = source_name(model)
        try:
            self._prepare(load(model))
        except (ValueError, TypeError, NotImplementedError) as error:
            if self._source is None or self._source in str(error):
                raise
            raise _named(None, error, self._source) from error

    def _prepare(self, model: onnx.ModelProto) -> None:
        """Check the model, rewrite and compile its nodes, list the tensors' lifetimes."""
        graph = model.graph
        self._opset = next((o.version for o in model.opset_import
                            if o.domain in ("", "ai.onnx")), 21)
        self._consts: dict[str, Array] = {}
        for i, t in enumerate(graph.initializer):
            name = check_text(lambda t=t: t.name, f"initializer #{i}'s name")
            self._consts[name] = tensor_array(t, f"initializer {name!r}")
        parsed = parse_nodes(model)
        nodes = [_Node(*node) for node in parsed]
        unsupported = sorted({f"{n.domain + '::' if n.domain else ''}{n.op_type}"
                              for n in nodes if lookup(n.domain, n.op_type) is None})
        if unsupported:
            names = [n.name for n in nodes if lookup(n.domain, n.op_type) is None]
            raise NotImplementedError(
                f"the model uses operators convengine.onnx does not support: "
                f"{', '.join(unsupported)} (nodes {', '.join(map(repr, names[:8]))}; supported: "
                f"{', '.join(supported_ops())})")
        check_graph(model, parsed, self._consts)
        self._inputs = [_info(v, "graph input") for v in graph.input
                        if v.name not in self._consts]
        self._outputs = [_info(v, "graph output") for v in graph.output]
        self._output_names = {o.name for o in self._outputs}
        self._declared = {o.name: o for o in self._outputs}
        nodes = self._rewrite_qdq_convs(nodes)
        nodes = self._rewrite_qdq_ops(nodes)
        nodes = self._fold_constants(nodes)
        nodes = self._fuse_qlinear_adds(nodes)
        nodes = self._fold_batch_norms(nodes)
        nodes = self._fuse_epilogues(nodes)
        self._nodes = self._prune(nodes)
        runs = []
        for node in self._nodes:
            with _naming(node):
                runs.append(self._compile(node))
        read = {n for node in self._nodes for n in node.inputs} | self._output_names
        self._consts = {k: v for k, v in self._consts.items() if k in read}  # weights
        # per node: its run, its inputs as (name, the initializer or None), its outputs
        # as (position, name) and the tensors to drop after it: a run looks each input
        # up once and does no other bookkeeping (a batch-1 network's nodes take tens of
        # microseconds, their Python a few)
        self._steps = [(run, [(n, self._consts.get(n)) for n in node.inputs],
                        [(i, n) for i, n in enumerate(node.outputs) if n], frees, node)
                       for run, node, frees in zip(runs, self._nodes, self._lifetimes(),
                                                   strict=True)]

    # -------------------------------------------------------------- public

    def get_inputs(self) -> list[TensorInfo]:
        return list(self._inputs)

    def get_outputs(self) -> list[TensorInfo]:
        return list(self._outputs)

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]
            ) -> list[Array]:
        """The named outputs (all for None) for ``input_feed`` {name: array}."""
        names = [o.name for o in self._outputs] if output_names is None else list(output_names)
        unknown = [n for n in names if n not in self._output_names]
        if unknown:
            raise ConvSetupError(f"output_names {unknown} are not graph outputs; expected "
                                 f"some of {[o.name for o in self._outputs]}")
        env = self._feeds(input_feed)
        threads = self.threads
        saved = get_num_threads() if threads is not None else None
        if threads is not None and saved != threads:
            set_num_threads(threads)
        wake_after_idle()
        try:
            for run, sources, outputs, frees, node in self._steps:
                # env and initializers are disjoint: an initializer is never an input
                try:
                    values = run([env.get(n, const) for n, const in sources])
                    for i, name in outputs:  # an op may leave optional outputs out
                        if i < len(values):
                            env[name] = values[i]
                except Exception as error:  # name the node, keep the kind
                    raise _named(node, error, self._source) from error
                for name in frees:
                    env.pop(name, None)
        finally:
            note_active()
            if saved is not None and saved != threads:
                set_num_threads(saved)
        results = [np.ascontiguousarray(self._value(env, n)) for n in names]
        for name, y in zip(names, results, strict=True):
            self._check_output(self._declared[name], y)
        return results

    def _check_output(self, info: TensorInfo, y: Array) -> None:
        """ConvSetupError if an output contradicts its declared type or fixed dims."""
        if (info.dtype is not None and y.dtype != info.dtype) or (info.shape and (
                len(info.shape) != y.ndim or any(isinstance(d, int) and d > 0 and d != n
                                                 for d, n in zip(info.shape, y.shape)))):
            raise ConvSetupError(f"graph output {info.name!r}: the model declares "
                                 f"{info.type} of shape {info.shape}, its nodes computed "
                                 f"{y.dtype} of shape {list(y.shape)}")

    # -------------------------------------------------------------- feeds

    def _value(self, env: Mapping[str, Any], name: str) -> Any:
        return env[name] if name in env else self._consts[name]

    def _feeds(self, feed: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(feed, Mapping):
            raise TypeError(f"input_feed must be a dict {{input name: array}}, got "
                            f"{type(feed).__name__}; inputs: {[i.name for i in self._inputs]}")
        known = {i.name for i in self._inputs}
        unknown = sorted(set(feed) - known)
        missing = [i.name for i in self._inputs if i.name not in feed]
        if unknown or missing:
            raise ConvSetupError(f"input_feed: unknown inputs {unknown}, missing inputs "
                                 f"{missing}; the model takes {sorted(known)}")
        env: dict[str, Any] = {}
        symbols: dict[str, int] = {}
        for info in self._inputs:
            a = np.asarray(feed[info.name])
            declared = f"{info.type} of shape {info.shape}"
            if info.dtype is not None and a.dtype != info.dtype:
                raise ConvSetupError(f"input {info.name!r}: expected {declared}, got a "
                                     f"{a.dtype} array of shape {list(a.shape)}")
            ok = not info.shape or len(info.shape) == a.ndim
            for d, n in zip(info.shape if ok else [], a.shape, strict=False):
                if isinstance(d, int) and d > 0 and d != n:
                    ok = False
                elif isinstance(d, str):
                    ok &= symbols.setdefault(d, n) == n
            if not ok:
                raise ConvSetupError(f"input {info.name!r}: expected {declared}, got shape "
                                     f"{list(a.shape)}")
            env[info.name] = a
        return env

    # -------------------------------------------------------------- graph rewrites

    def _consumers(self, nodes: Sequence[_Node]) -> dict[str, list[_Node]]:
        users: dict[str, list[_Node]] = {}
        for node in nodes:
            for name in node.inputs:
                if name:
                    users.setdefault(name, []).append(node)
        return users

    def _only_user(self, users: Mapping[str, list[_Node]], name: str) -> _Node | None:
        found = users.get(name, [])
        if len(found) == 1 and name not in self._output_names:
            return found[0]
        return None

    def _fold_constants(self, nodes: list[_Node]) -> list[_Node]:
        """Evaluate every node whose inputs are all constants, once."""
        kept = []
        for node in nodes:
            if all(not n or n in self._consts for n in node.inputs) and \
                    not set(node.outputs) & self._output_names:
                try:
                    values = self._generic(node)([self._consts[n] if n else None
                                                  for n in node.inputs])
                except Exception as error:
                    raise _named(node, error) from error
                self._consts.update((n, np.asarray(v)) for n, v in zip(node.outputs, values,
                                                                        strict=False) if n)
            else:
                kept.append(node)
        return kept

    def _producer_map(self, nodes: Sequence[_Node]) -> dict[str, _Node]:
        return {o: n for n in nodes for o in n.outputs if o}

    def _rewrite_qdq_convs(self, nodes: list[_Node]) -> list[_Node]:
        """DQ(x) -> Conv(DQ(w const)[, DQ(b int32 const)]) [-> Relu] -> Q  ==>  one
        int8 QLinearConv (ONNX Runtime runs QDQ convs the same way)."""
        made = {o: n for n in nodes for o in n.outputs if o}
        users = self._consumers(nodes)
        c = self._consts
        dropped: set[int] = set()
        for conv in nodes:
            with _naming(conv):
                if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
                    continue
                dqs = [made.get(n) for n in conv.inputs]
                if len(dqs) < 2 or any(d is None or d.op_type != "DequantizeLinear" for d in dqs):
                    continue
                dx, dw = dqs[0], dqs[1]
                if dx is None or dw is None:
                    continue
                chain = [conv]
                nxt = self._only_user(users, conv.outputs[0])
                if nxt is not None and nxt.op_type == "Relu":
                    chain.append(nxt)
                    nxt = self._only_user(users, nxt.outputs[0])
                if nxt is None or nxt.op_type != "QuantizeLinear" or len(nxt.inputs) < 3:
                    continue
                q = nxt
                params = [dx.inputs[1:3], dw.inputs[1:3], q.inputs[1:3]]
                if any(len(p) < 2 or any(n not in c for n in p) for p in params) \
                        or dw.inputs[0] not in c or c[dw.inputs[0]].dtype != np.int8 \
                        or any(c[n].size != 1 for n in [*params[0], *params[2]]):
                    continue  # QLinearConv's x and y parameters are per tensor
                bias = ""
                if len(conv.inputs) > 2 and conv.inputs[2]:
                    db = dqs[2]
                    b_q = None if db is None else c.get(db.inputs[0])
                    if db is None or b_q is None or b_q.dtype != np.int32 or \
                            len(db.inputs) < 2 or db.inputs[1] not in c or not _allclose(
                                c[db.inputs[1]], np.float32(c[dx.inputs[1]].reshape(()))
                                * c[dw.inputs[1]].astype(np.float32)):
                        continue
                    bias = db.inputs[0]
                inputs = [dx.inputs[0], *dx.inputs[1:3], dw.inputs[0], *dw.inputs[1:3],
                          *q.inputs[1:3], bias]
                fused = _Node(conv.name, "QLinearConv", "", inputs, list(q.outputs),
                              dict(conv.attrs))
                if len(chain) == 2:
                    fused.attrs["_relu"] = True
                index = nodes.index(q)
                nodes[index] = fused
                dropped.update(id(n) for n in chain)
        return [n for n in nodes if id(n) not in dropped]

    def _rewrite_qdq_ops(self, nodes: list[_Node]) -> list[_Node]:
        """DQ -> Add / GlobalAveragePool / MaxPool, Flatten, Reshape / Gemm -> Q  ==>
        QLinearAdd, QLinearGlobalAveragePool, the op on the integers (equal parameters on
        both sides), QGemm, as ONNX Runtime fuses them, when every quantization parameter
        is a per-tensor constant."""
        made = self._producer_map(nodes)
        users = self._consumers(nodes)
        c = self._consts
        dropped: set[int] = set()

        def params(dq: _Node | None, per_axis: tuple[int, int] | None = None
                   ) -> list[str] | None:
            """The DQ / Q node's inputs when its scale and zero point are per-tensor
            constants, or, with ``per_axis`` (axis, size), constants of that size along
            that axis of a 2-D tensor (a Gemm's per-column weights)."""
            if dq is None or dq.op_type not in ("DequantizeLinear", "QuantizeLinear") or \
                    len(dq.inputs) < 3 or any(n not in c for n in dq.inputs[1:3]):
                return None
            sizes = {c[n].size for n in dq.inputs[1:3]}
            if sizes == {1}:
                return dq.inputs[:3]
            if per_axis is None or sizes != {per_axis[1]} or \
                    int(dq.attrs.get("axis", 1)) % 2 != per_axis[0]:
                return None
            return dq.inputs[:3]

        def per_column(gemm: _Node, dq: _Node | None) -> list[str] | None:
            """A QDQ Gemm's B dequantized per output column (``quantize_static``'s
            per-channel weights: scale and zero point along B's N axis, axis 0 of B
            when ``transB``, else 1), as QGemm takes it; None if it is not."""
            if dq is None or dq.op_type != "DequantizeLinear" or dq.inputs[0] not in c or \
                    c[dq.inputs[0]].ndim != 2:
                return None
            axis = 0 if int(gemm.attrs.get("transB", 0)) else 1
            return params(dq, (axis, c[dq.inputs[0]].shape[axis]))

        for node in nodes:
            with _naming(node):
                if node.op_type not in ("Add", "GlobalAveragePool", "MaxPool", "Flatten", "Reshape",
                                        "Gemm") or \
                        len([o for o in node.outputs if o]) != 1:
                    continue
                q = self._only_user(users, node.outputs[0])
                qp = params(q) if q is not None and q.op_type == "QuantizeLinear" else None
                dqs = [made.get(n) for n in node.inputs if n]
                ins = [params(d) if d is not None and d.op_type == "DequantizeLinear" else None
                       for d in dqs]
                if q is None or qp is None or not ins or ins[0] is None:
                    continue
                if node.op_type == "Gemm" and len(ins) >= 2 and ins[1] is None:
                    ins[1] = per_column(node, dqs[1])
                op, domain, inputs, attrs = "", "com.microsoft", [], {}
                if node.op_type == "Add" and len(ins) == 2 and ins[1] is not None:
                    op, inputs = "QLinearAdd", [*ins[0], *ins[1], *qp[1:]]
                elif node.op_type == "GlobalAveragePool":
                    op, inputs, attrs = "QLinearGlobalAveragePool", [*ins[0], *qp[1:]], \
                        {"channels_last": 0}
                elif node.op_type in ("MaxPool", "Flatten", "Reshape") and all(
                        np.array_equal(c[a], c[b]) for a, b in zip(ins[0][1:], qp[1:])):
                    op, domain, attrs = node.op_type, "", dict(node.attrs)
                    inputs = [ins[0][0], *node.inputs[1:]]
                elif node.op_type == "Gemm" and len(ins) >= 2 and ins[1] is not None and \
                        float(node.attrs.get("beta", 1.0)) == 1.0:
                    bias = ""
                    if len(ins) == 3:
                        b_dq = dqs[2]
                        if b_dq is None or b_dq.op_type != "DequantizeLinear" or \
                                len(b_dq.inputs) < 2:
                            continue  # a float bias: the Gemm stays float
                        b_q = c.get(b_dq.inputs[0])
                        expected = np.float32(c[ins[0][1]].reshape(())) * \
                            c[ins[1][1]].astype(np.float32)
                        b_zp = c.get(b_dq.inputs[2]) if len(b_dq.inputs) > 2 else None
                        if b_q is None or b_q.dtype != np.int32 or \
                                (b_zp is not None and np.any(b_zp)) or \
                                b_dq.inputs[1] not in c or not _allclose(
                                    c[b_dq.inputs[1]], expected):
                            continue
                        bias = b_dq.inputs[0]
                    op, inputs = "QGemm", [*ins[0], *ins[1], bias, *qp[1:]]
                    attrs = {k: node.attrs[k] for k in ("alpha", "transA", "transB")
                             if k in node.attrs}
                if not op:
                    continue
                nodes[nodes.index(q)] = _Node(node.name, op, domain, inputs, list(q.outputs), attrs)
                dropped.add(id(node))
        return [n for n in nodes if id(n) not in dropped]

    def _fuse_qlinear_adds(self, nodes: list[_Node]) -> list[_Node]:
        """QLinearConv -> QLinearAdd  ==>  the conv with the add in its kernel
        (:class:`QConvStep`), when the conv's output feeds the add alone, every
        parameter of both is a constant (the add's per tensor) and the add's output has
        the conv's dtype. Of the add's two inputs the later made takes it (the other
        exists by then); the conv's rounded result enters the add as before."""
        made = self._producer_map(nodes)
        users = self._consumers(self._prune(nodes))  # not the QDQ rewrites' dead DQs
        order = {id(n): i for i, n in enumerate(nodes)}
        c = self._consts
        dropped: set[int] = set()
        for add in nodes:
            with _naming(add):
                if add.op_type != "QLinearAdd" or add.domain != "com.microsoft" or \
                        len(add.inputs) != 8 or add.inputs[0] == add.inputs[3] or any(
                            not n or n not in c or c[n].size != 1 for n in add.inputs[1:3]
                            + add.inputs[4:]):
                    continue
                last = max((made[n] for n in (add.inputs[0], add.inputs[3]) if n in made),
                           key=lambda n: order[id(n)], default=None)
                conv = last if last is not None and last.op_type == "QLinearConv" else None
                if conv is None or "_add" in conv.attrs or \
                        self._only_user(users, conv.outputs[0]) is not add or \
                        len(conv.inputs) < 8 or not conv.inputs[2] or not conv.inputs[7] or \
                        any(n not in c for n in conv.inputs[1:9] if n) or \
                        c[conv.inputs[7]].dtype != c[add.inputs[7]].dtype:
                    continue
                first = conv.outputs[0] == add.inputs[0]
                conv.attrs["_add"] = (first, [c[add.inputs[i]] for i in (1, 2, 4, 5, 6, 7)])
                conv.inputs = [*conv.inputs, *[""] * (9 - len(conv.inputs)),
                               add.inputs[3 if first else 0]]
                conv.outputs = list(add.outputs)
                dropped.add(id(add))
        return [n for n in nodes if id(n) not in dropped]

    def _fold_batch_norms(self, nodes: list[_Node]) -> list[_Node]:
        """Conv (constant weights) -> BatchNormalization  ==>  one conv."""
        made = self._producer_map(nodes)
        users = self._consumers(nodes)
        c = self._consts
        dropped: set[int] = set()
        for bn in nodes:
            with _naming(bn):
                if bn.op_type != "BatchNormalization" or bn.attrs.get("training_mode", 0):
                    continue
                conv = made.get(bn.inputs[0])
                if conv is None or conv.op_type != "Conv" or \
                        self._only_user(users, bn.inputs[0]) is not bn or \
                        any(n not in c for n in bn.inputs[1:5]) or conv.inputs[1] not in c or \
                        (len(conv.inputs) > 2 and conv.inputs[2] and conv.inputs[2] not in c) or \
                        len([o for o in bn.outputs if o]) > 1:
                    continue
                w = c[conv.inputs[1]]
                shapes = [list(c[n].shape) for n in bn.inputs[1:5]]
                if w.ndim < 3 or any(shape != [w.shape[0]] for shape in shapes):
                    raise ConvSetupError(
                        f"scale, B, input_mean, input_var must each have shape "
                        f"[{w.shape[0] if w.ndim else '?'}] (the channels of conv "
                        f"{conv.name!r}'s weight of shape {list(w.shape)}), got {shapes}")
                scale, beta, mean, var = (c[n].astype(np.float64) for n in bn.inputs[1:5])
                inv = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
                b = c[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and \
                    conv.inputs[2] else np.zeros(w.shape[0])
                w_name, b_name = f"{conv.name}/bn_folded_w", f"{conv.name}/bn_folded_b"
                c[w_name] = (w * inv.reshape(-1, *(1,) * (w.ndim - 1))).astype(w.dtype)
                c[b_name] = ((b - mean) * inv + beta).astype(w.dtype)
                conv.inputs = [conv.inputs[0], w_name, b_name]
                conv.outputs = [bn.outputs[0]]
                dropped.add(id(bn))
        return [n for n in nodes if id(n) not in dropped]

    def _fuse_epilogues(self, nodes: list[_Node]) -> list[_Node]:
        """Conv -> [Add] -> [activation, or x * Sigmoid(x)]  ==>  one step at the chain's
        last node."""
        users = self._consumers(nodes)
        c = self._consts
        out: list[_Node] = []
        moved: dict[int, _Node] = {}  # id(last node of a chain) -> fused conv
        absorbed: set[int] = set()
        for conv in nodes:
            with _naming(conv):
                if conv.op_type != "Conv" or conv.inputs[1] not in c:
                    continue
                steps: list[tuple[str, Any]] = []
                extra: list[str] = []
                last = conv
                nxt = self._only_user(users, conv.outputs[0])
                if nxt is not None and nxt.op_type == "Add" and len(nxt.inputs) == 2 \
                        and id(nxt) not in absorbed:
                    other = nxt.inputs[1] if nxt.inputs[0] == conv.outputs[0] else nxt.inputs[0]
                    if other != conv.outputs[0]:
                        steps.append(("add", len(extra)))
                        extra.append(other)
                        absorbed.add(id(nxt))
                        last = nxt
                        nxt = self._only_user(users, nxt.outputs[0])
                act = None if nxt is None else _epilogue_step(nxt, c)
                silu = self._silu(users, last.outputs[0]) if nxt is None else None
                if nxt is not None and act is not None:
                    steps.append(act)
                    absorbed.add(id(nxt))
                    last = nxt
                elif silu is not None:  # x * Sigmoid(x)
                    steps.append(("silu", None))
                    absorbed.update(id(n) for n in silu)
                    last = silu[1]
                if last is conv:
                    continue
                conv.attrs["_epilogue"] = steps
                conv.inputs = [*conv.inputs[:3], *[""] * (3 - len(conv.inputs)), *extra]
                conv.outputs = [last.outputs[0]]
                moved[id(last)] = conv
                absorbed.add(id(conv))
        for node in nodes:
            if id(node) in moved:
                out.append(moved[id(node)])
            elif id(node) not in absorbed:
                out.append(node)
        return out

    def _silu(self, users: Mapping[str, list[_Node]], name: str) -> tuple[_Node, _Node] | None:
        """(Sigmoid, Mul) when ``name`` feeds exactly ``Mul(name, Sigmoid(name))``."""
        found = users.get(name, [])
        if len(found) != 2 or name in self._output_names:
            return None
        sig = next((n for n in found if n.op_type == "Sigmoid"), None)
        mul = next((n for n in found if n.op_type == "Mul"), None)
        if sig is None or mul is None or self._only_user(users, sig.outputs[0]) is not mul \
                or sorted(mul.inputs) != sorted([name, sig.outputs[0]]):
            return None
        return sig, mul

    def _prune(self, nodes: list[_Node]) -> list[_Node]:
        """Drop nodes none of whose outputs reach a graph output."""
        needed = set(self._output_names)
        kept = []
        for node in reversed(nodes):
            if needed & set(node.outputs):
                kept.append(node)
                needed.update(n for n in node.inputs if n)
        missing = sorted(n for n in needed if n not in self._consts
                         and n not in {i.name for i in self._inputs}
                         and not any(n in k.outputs for k in kept))
        if missing:
            raise ConvSetupError(f"the graph reads tensors no node, input or initializer "
                                 f"defines: {missing}")
        return kept[::-1]

    def _lifetimes(self) -> list[list[str]]:
        """Per node, the tensors to drop after it (their last reader, or unread)."""
        last: dict[str, int] = {}
        for i, node in enumerate(self._nodes):
            for name in [*node.inputs, *node.outputs]:
                if name and name not in self._consts:
                    last[name] = i
        frees: list[list[str]] = [[] for _ in self._nodes]
        for name, i in last.items():
            if name not in self._output_names:
                frees[i].append(name)
        return frees

    # -------------------------------------------------------------- compiling

    def _generic(self, node: _Node) -> Callable[[list[Any]], list[Array]]:
        fn = lookup(node.domain, node.op_type)
        if fn is None:
            raise NotImplementedError(f"operator {node.domain}::{node.op_type}")
        attrs = dict(node.attrs)
        if node.op_type in OPSET_DEPENDENT and node.domain in ("", "ai.onnx"):
            attrs["opset"] = self._opset
        if node.op_type in SINGLE_OUTPUT and len([o for o in node.outputs if o]) > 1:
            raise NotImplementedError(f"{node.op_type} node {node.name!r} asks for "
                                      f"{len(node.outputs)} outputs; only the first is produced")
        return lambda args: fn(args, attrs)

    def _compile(self, node: _Node) -> Callable[[list[Any]], list[Array]]:
        c = self._consts
        if node.op_type == "Conv" and node.inputs[1] in c:
            w = c[node.inputs[1]]
            b_name = node.inputs[2] if len(node.inputs) > 2 else ""
            if b_name and b_name not in c:
                raise ConvSetupError(f"node {node.name!r} (Conv): bias {b_name!r} must be "
                                     f"an initializer when W is one")
            step = ConvStep(w, c[b_name] if b_name else None, conv_args(node.attrs, w.shape),
                            node.attrs.get("_epilogue", []))
            node.inputs = [node.inputs[0], *node.inputs[3:]]  # w, b held (laid out) by the step
            w_shape = w.shape  # w itself not kept: the step holds its own layout

            def run_conv(xs: list[Any]) -> list[Array]:
                x = np.asarray(xs[0])
                check_rank(x, w_shape)
                return [step(x, xs[1:])]
            return run_conv
        if node.op_type == "QLinearConv" and all(n in c for n in node.inputs[1:9] if n):
            w = c[node.inputs[3]]
            params: list[Any] = [c[n] if n else None for n in node.inputs[1:9]] + [None] * 8
            xs, xzp, _, ws, wzp, ys, yzp, b = params[:8]
            if xzp is None or yzp is None:
                return self._generic(node)
            qstep = QConvStep(w, xs, xzp, ws, wzp, b, conv_args(node.attrs, w.shape),
                              y_scale=ys, y_zp=yzp, relu=bool(node.attrs.get("_relu", False)),
                              add=node.attrs.get("_add"))
            node.inputs = [node.inputs[0], *node.inputs[9:]]  # held by the step; [9]: add's

            qw_shape = w.shape  # w itself not kept: the step holds its own layout

            def run_qconv(xs: list[Any]) -> list[Array]:
                x = np.asarray(xs[0])
                check_rank(x, qw_shape)
                return [qstep(x, *xs[1:])]
            return run_qconv
        if node.op_type == "Gemm" and all(n in c for n in node.inputs[1:3] if n):
            b_, c_ = c[node.inputs[1]], (c[node.inputs[2]] if len(node.inputs) > 2
                                           and node.inputs[2] else None)
            if gemm_step(b_, c_, node.attrs):
                gstep = GemmStep(b_, c_, node.attrs)
                node.inputs = node.inputs[:1]  # B, C held by the step
                return lambda xs: [gstep(np.asarray(xs[0]))]
        if node.op_type == "QGemm" and node.domain == "com.microsoft" and \
                len(node.inputs) >= 6 and all(n in c for n in node.inputs[1:6] if n):
            return self._compile_qgemm(node)
        return self._generic(node)


    def _compile_qgemm(self, node: _Node) -> Callable[[list[Any]], list[Array]]:
        """QGemm with constant B and quantization parameters: the int32 accumulator
        by convengine's int8 kernels, as a 1x1 conv of A ``(M, 1, 1, K)`` (8-bit A,
        ``transA=0``), else by dgemm over B centered once; then QGemm's float32 output."""
        c = self._consts
        b, b_zp = c[node.inputs[3]], c.get(node.inputs[5])
        a_zp = c.get(node.inputs[2])
        attrs = dict(node.attrs)
        trans_b = bool(int(attrs.get("transB", 0)))
        node.inputs[3] = ""  # held by the step
        if not int(attrs.get("transA", 0)) and b.dtype.itemsize == 1 and \
                a_zp is not None and a_zp.size == 1:
            bt = b if trans_b else b.T  # (N, K)
            w = bt.reshape(*bt.shape, 1, 1)
            wzp = np.zeros((), b.dtype) if b_zp is None else b_zp
            gemm = QConvStep(w, 1.0, a_zp, 1.0, wzp, None, conv_args({}, w.shape))

            def run_qgemm_int8(xs: list[Any]) -> list[Array]:
                a, a_s, _, _, b_s, _, c_, y_s, y_zp = xs + [None] * (9 - len(xs))
                a = np.asarray(a)
                if a.ndim != 2 or a.dtype.itemsize != 1:
                    raise ConvSetupError(f"QGemm needs a 2-D 8-bit A, got {a.dtype} of "
                                         f"shape {a.shape}")
                acc = gemm(to_first(a.reshape(a.shape[0], 1, 1, a.shape[1])))
                return [qgemm_output(to_last(acc).reshape(a.shape[0], -1), a_s, b_s, c_, y_s,
                                     y_zp, attrs)]
            return run_qgemm_int8
        b_centered = qgemm_weight(b, b_zp, trans_b)

        def run_qgemm(xs: list[Any]) -> list[Array]:
            a, a_s, a_zp, _, b_s, _, c_, y_s, y_zp = xs + [None] * (9 - len(xs))
            return [qgemm(np.asarray(a), a_s, a_zp, b_centered, b_s, c_, y_s, y_zp, attrs)]
        return run_qgemm


def supported_ops() -> list[str]:
    """Every registered operator, ``domain::op`` outside the default domain."""
    return [f"{d + '::' if d else ''}{op}" for d, ops in DOMAINS.items() for op in ops]


def run_model(model: Any, inputs: Mapping[str, Any] | Sequence[Any]) -> list[Array]:
    """Run a model once: ``inputs`` maps input names to arrays, or lists them in the
    order of ``get_inputs()``. Returns every graph output, in order."""
    session = Session(model)
    if not isinstance(inputs, Mapping):
        if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
            raise TypeError(f"inputs must be a dict {{name: array}} or a list of arrays, got "
                            f"{type(inputs).__name__}")
        names = [i.name for i in session.get_inputs()]
        if len(inputs) != len(names):
            raise ConvSetupError(f"the model takes {len(names)} inputs {names}, got "
                                 f"{len(inputs)}")
        inputs = dict(zip(names, inputs, strict=True))
    return session.run(None, inputs)
