"""Reading ONNX protobufs without importing the ``onnx`` package.

``import onnx`` takes about a second (its C++ extension, ``ml_dtypes``, its helpers);
the protobuf classes alone take a few tens of milliseconds. This module loads
``onnx/onnx_ml_pb2.py`` from the installed onnx package by its file, without running
``onnx/__init__.py`` (or uses ``onnx.onnx_ml_pb2`` when the process has imported onnx:
the same descriptors, registered once in protobuf's default pool), and replaces the
parts of onnx that convengine.onnx needs:

- :data:`ModelProto`, :data:`NodeProto`, :data:`TensorProto`, ... the message classes;
- :func:`np_dtype`, :func:`type_name`: a ``TensorProto.DataType`` as a numpy dtype and
  as a name (``ml_dtypes`` imported only for its types: bfloat16, float8, 4/2/6-bit);
- :func:`to_array`: a tensor's data as an array (raw_data or the typed fields,
  little-endian), its size checked against its dims;
- :func:`attribute_value`: an attribute as a Python value;
- :func:`load_model`: a ModelProto from a path (external data read from the model's
  directory, never outside it), the model's bytes, or a ModelProto made by either
  protobuf module;
- :func:`schema_inputs`: the (min, max) input counts of the supported operators per
  opset, as ``onnx.defs`` defines them.
"""

from __future__ import annotations

import importlib.util
import math
import os
import stat
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import ConvSetupError


def _load_pb2() -> ModuleType:
    """onnx's generated protobuf module: ``onnx.onnx_ml_pb2`` when onnx is imported,
    else the file itself, loaded without the onnx package."""
    if "onnx" in sys.modules or "onnx.onnx_ml_pb2" in sys.modules:
        import onnx.onnx_ml_pb2 as imported  # onnx is loaded already: its classes

        return imported
    spec = importlib.util.find_spec("onnx")  # finds the package, does not run it
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "onnx_ml_pb2.py")
        if os.path.isfile(path):
            break
    else:
        raise ImportError("convengine.onnx reads models with the onnx package's protobuf "
                          "classes; install it: pip install 'convengine[onnx]'")
    file_spec = importlib.util.spec_from_file_location("convengine.onnx.proto.onnx_ml_pb2",
                                                       path)
    assert file_spec is not None and file_spec.loader is not None
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)  # registers onnx/onnx-ml.proto; not in sys.modules
    return module


pb2 = _load_pb2()
ModelProto: Any = pb2.ModelProto
GraphProto: Any = pb2.GraphProto
NodeProto: Any = pb2.NodeProto
AttributeProto: Any = pb2.AttributeProto
TensorProto: Any = pb2.TensorProto
ValueInfoProto: Any = pb2.ValueInfoProto


def is_message(value: Any, name: str) -> bool:
    """True when ``value`` is the ONNX message ``name`` ("ModelProto"), made by this
    module's classes or by the onnx package's (compared by descriptor full name)."""
    descriptor = getattr(value, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", None) == f"onnx.{name}"


# ------------------------------------------------------------------ data types

# TensorProto.DataType -> numpy dtype name; ml_dtypes' names for the types numpy lacks
_NUMPY = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
          7: "int64", 8: "object", 9: "bool", 10: "float16", 11: "float64", 12: "uint32",
          13: "uint64", 14: "complex64", 15: "complex128"}
_ML_DTYPES = {16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2",
              20: "float8_e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4_e2m1fn",
              24: "float8_e8m0fnu", 25: "uint2", 26: "int2", 27: "float6_e2m3fn",
              28: "float6_e3m2fn"}
STRING = 8
# where each type's values are when raw_data is absent: the typed field, the bits one
# value takes in raw_data, and how int32_data holds it ("bits": 16-bit patterns,
# "bytes": 8-bit patterns, "packed": bytes of packed sub-byte values, "low6": one 6-bit
# value per entry, "cast": the value itself)
_STORAGE: dict[int, tuple[str, int, str]] = {
    1: ("float_data", 32, "cast"), 11: ("double_data", 64, "cast"),
    14: ("float_data", 64, "complex"), 15: ("double_data", 128, "complex"),
    7: ("int64_data", 64, "cast"), 12: ("uint64_data", 32, "cast"),
    13: ("uint64_data", 64, "cast"), 6: ("int32_data", 32, "cast"),
    2: ("int32_data", 8, "cast"), 3: ("int32_data", 8, "cast"),
    4: ("int32_data", 16, "bits"), 5: ("int32_data", 16, "bits"),
    10: ("int32_data", 16, "bits"), 16: ("int32_data", 16, "bits"),
    9: ("int32_data", 8, "bytes"), **{k: ("int32_data", 8, "bytes") for k in (17, 18, 19, 20, 24)},
    **{k: ("int32_data", 4, "packed") for k in (21, 22, 23)},
    **{k: ("int32_data", 2, "packed") for k in (25, 26)},
    **{k: ("int32_data", 6, "low6") for k in (27, 28)},
}
_dtypes: dict[int, np.dtype] = {}


def np_dtype(data_type: int) -> np.dtype:
    """The numpy dtype of a ``TensorProto.DataType`` (as
    ``onnx.helper.tensor_dtype_to_np_dtype``); KeyError for a number that is none.
    ``ml_dtypes`` is imported only for the types numpy lacks (bfloat16, float8, ...)."""
    dtype = _dtypes.get(data_type)
    if dtype is None:
        if data_type in _NUMPY:
            dtype = np.dtype(_NUMPY[data_type])
        elif data_type in _ML_DTYPES:
            import ml_dtypes  # ~0.6 s to import: only where such a type appears

            name = _ML_DTYPES[data_type]
            if not hasattr(ml_dtypes, name):
                raise KeyError(f"data_type {data_type} ({name}) needs a newer ml_dtypes than "
                               f"{ml_dtypes.__version__}")
            dtype = np.dtype(getattr(ml_dtypes, name))
        else:
            raise KeyError(data_type)
        _dtypes[data_type] = dtype
    return dtype


def type_name(data_type: int) -> str:
    """The type's name, ``FLOAT`` (ValueError for a number that is none)."""
    return str(TensorProto.DataType.Name(data_type))


# ------------------------------------------------------------------ tensors


def raw_size(t: Any) -> int | None:
    """The bytes of raw_data the tensor's dims and data type take (None for a type
    this module cannot size: string, unknown)."""
    storage = _STORAGE.get(t.data_type)
    if storage is None:
        return None
    return -(-math.prod(t.dims) * storage[1] // 8)


def _unpack(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    """``count`` values of ``bits`` bits each, packed low bits first into ``data``
    (uint8): one uint8 per value."""
    stream = np.unpackbits(data, bitorder="little")[:count * bits].reshape(count, bits)
    return np.packbits(stream, axis=1, bitorder="little").reshape(count)


def to_array(t: Any, what: str = "tensor") -> np.ndarray:
    """The tensor ``t`` as an array of its dims (as ``onnx.numpy_helper.to_array``),
    read-only where it views raw_data; a data size that does not match the dims, a
    string or segmented tensor, an unknown type or data in an external file is a
    ConvSetupError naming ``what``."""
    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise ConvSetupError(f"{what}: negative dim in its shape {dims}")
    count = math.prod(dims)
    if t.HasField("segment"):
        raise ConvSetupError(f"{what}: segmented tensors are not supported")
    if t.data_location == TensorProto.EXTERNAL or len(t.external_data):
        raise ConvSetupError(f"{what}: its data is in an external file; load the model "
                             f"from its path (the file next to it)")
    try:
        dtype = np_dtype(t.data_type)
    except KeyError as error:
        raise ConvSetupError(f"{what}: data_type {t.data_type} is not an ONNX tensor type"
                             f"{'' if error.args[0] == t.data_type else f' ({error.args[0]})'}"
                             ) from None
    if t.data_type == STRING:
        raise ConvSetupError(f"{what}: string tensors are not supported")
    field, bits, form = _STORAGE[t.data_type]
    if t.HasField("raw_data"):
        held, need = len(t.raw_data), -(-count * bits // 8)
        if held != need:
            raise ConvSetupError(f"{what}: shape {dims} of {dtype} needs {need:,} bytes "
                                 f"of raw_data, it holds {held:,}")
        if form in ("packed", "low6"):
            return _unpack(np.frombuffer(t.raw_data, np.uint8), bits, count) \
                .view(dtype).reshape(dims)
        array = np.frombuffer(t.raw_data, dtype)
        if sys.byteorder == "big":
            array = array.byteswap()
        return array.reshape(dims)
    values = getattr(t, field)
    need = -(-count * bits // 8) if form == "packed" else 2 * count if form == "complex" \
        else count
    if len(values) != need:
        raise ConvSetupError(f"{what}: shape {dims} needs {need:,} values in "
                             f"{field}, it holds {len(values):,}")
    if form == "cast":
        storage = {"float_data": np.float32, "double_data": np.float64,
                   "int64_data": np.int64, "uint64_data": np.uint64,
                   "int32_data": np.int32}[field]
        return np.asarray(values, dtype=storage).astype(dtype).reshape(dims)
    if form == "complex":
        part = np.float32 if field == "float_data" else np.float64
        return np.array(values, dtype=part).view(dtype).reshape(dims)
    patterns = np.array(values, dtype=np.int32).view(np.uint32)
    if form == "bits":
        return patterns.astype(np.uint16).view(dtype).reshape(dims)
    if form == "bytes":
        return patterns.astype(np.uint8).view(dtype).reshape(dims)
    if form == "low6":
        return (patterns.astype(np.uint8) & 0x3F).view(dtype).reshape(dims)
    return _unpack(patterns.astype(np.uint8), bits, count).view(dtype).reshape(dims)


def attribute_value(a: Any) -> Any:
    """The attribute's value (as ``onnx.helper.get_attribute_value``): a number, bytes,
    a message, or a list of them; None for UNDEFINED. A reference attribute (inside a
    function) or an unknown type is a ValueError."""
    if a.ref_attr_name:
        raise ValueError(f"attribute {a.name!r} refers to {a.ref_attr_name!r} (a function's "
                         f"attribute); it has no value")
    field = _ATTRIBUTE_FIELDS.get(a.type)
    if field is None:
        if a.type == AttributeProto.UNDEFINED:
            return None
        raise ValueError(f"attribute {a.name!r}: unknown attribute type {a.type}")
    value = getattr(a, field)
    return list(value) if field in _REPEATED else value


_ATTRIBUTE_FIELDS = {
    AttributeProto.FLOAT: "f", AttributeProto.INT: "i", AttributeProto.STRING: "s",
    AttributeProto.TENSOR: "t", AttributeProto.SPARSE_TENSOR: "sparse_tensor",
    AttributeProto.GRAPH: "g", AttributeProto.TYPE_PROTO: "tp",
    AttributeProto.FLOATS: "floats", AttributeProto.INTS: "ints",
    AttributeProto.STRINGS: "strings", AttributeProto.TENSORS: "tensors",
    AttributeProto.SPARSE_TENSORS: "sparse_tensors", AttributeProto.GRAPHS: "graphs",
    AttributeProto.TYPE_PROTOS: "type_protos",
}
_REPEATED = {"floats", "ints", "strings", "tensors", "sparse_tensors", "graphs", "type_protos"}


# ------------------------------------------------------------------ loading


def _tensors(graph: Any, where: str = "") -> Iterator[tuple[Any, str]]:
    """Every tensor of ``graph`` and its subgraphs with how errors name it: the
    initializers and the nodes' tensor attributes (the ones onnx.load reads)."""
    for t in graph.initializer:
        yield t, f"initializer {t.name!r}{where}"
    for i, node in enumerate(graph.node):
        label = f"node {node.name or f'#{i}'!r} ({node.op_type})"
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t, f"{label} attribute {a.name!r}{where}"
            for t in a.tensors:
                yield t, f"{label} attribute {a.name!r}{where}"
            subgraphs = [a.g] if a.HasField("g") else []
            for g in [*subgraphs, *a.graphs]:
                yield from _tensors(g, f" (in a subgraph of {label})")


def _external_data(t: Any, base_dir: str, what: str) -> bytes:
    """The bytes of ``t``'s external data: the file ``location`` (relative, inside
    ``base_dir``, a regular file), ``length`` bytes from ``offset``; anything else is a
    ConvSetupError naming ``what`` and the reason."""
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    if not location or "\0" in location:
        raise ConvSetupError(f"{what}: its external data has no valid location")
    parts = location.replace("\\", "/").split("/")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or \
            os.path.splitdrive(location)[0] or ".." in parts:
        raise ConvSetupError(f"{what}: external data location {location!r} is not a "
                             f"relative path inside the model's directory")
    base = os.path.realpath(base_dir or os.curdir)
    path = os.path.realpath(os.path.join(base, location))
    if os.path.commonpath([base, path]) != base:
        raise ConvSetupError(f"{what}: external data location {location!r} leads out of "
                             f"the model's directory (a symbolic link?)")
    numbers = {}
    for key in ("offset", "length"):
        try:
            numbers[key] = int(info[key]) if key in info else None
        except ValueError:
            raise ConvSetupError(f"{what}: external data {key} {info[key]!r} is not an "
                                 f"integer") from None
        if (numbers[key] or 0) < 0:
            raise ConvSetupError(f"{what}: external data {key} {numbers[key]} is negative")
    try:  # O_NONBLOCK: a FIFO does not block the open; O_NOFOLLOW: no link swapped in
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
    except OSError as error:
        raise ConvSetupError(f"{what}: its external data file {location!r} cannot be "
                             f"opened: {error.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConvSetupError(f"{what}: its external data {location!r} is not a "
                                 f"regular file")
        offset = numbers["offset"] or 0
        if offset > st.st_size:
            raise ConvSetupError(f"{what}: external data offset {offset:,} is beyond the "
                                 f"end of {location!r} ({st.st_size:,} bytes)")
        length = st.st_size - offset if numbers["length"] is None else numbers["length"]
        if offset + length > st.st_size:
            raise ConvSetupError(f"{what}: external data offset {offset:,} + length "
                                 f"{length:,} is beyond the end of {location!r} "
                                 f"({st.st_size:,} bytes)")
        need = raw_size(t)
        if need is not None and length != need:
            raise ConvSetupError(f"{what}: shape {list(t.dims)} needs {need:,} bytes of "
                                 f"external data, {location!r} holds {length:,} from "
                                 f"offset {offset:,}")
        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(offset)
            data = f.read(length)
    except OSError as error:
        raise ConvSetupError(f"{what}: its external data file {location!r} cannot be "
                             f"read: {error.strerror}") from None
    finally:
        os.close(fd)
    if len(data) != length:
        raise ConvSetupError(f"{what}: {location!r} ended before {length:,} bytes")
    return data


def load_external_data(model: Any, base_dir: str, max_elements: int) -> None:
    """Read every tensor's external data into its raw_data (as ``onnx.load`` does),
    from files inside ``base_dir``; a tensor declaring more than ``max_elements``
    values or negative dims is refused before its file is read."""
    for t, what in _tensors(model.graph):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        dims = list(t.dims)
        if any(d < 0 for d in dims):
            raise ConvSetupError(f"{what}: negative dim in its shape {dims}")
        if math.prod(dims) > max_elements:
            raise ConvSetupError(f"{what}: its shape {dims} declares {math.prod(dims):,} "
                                 f"elements, more than the {max_elements:,} allowed")
        t.raw_data = _external_data(t, base_dir, what)
        t.data_location = TensorProto.DEFAULT
        del t.external_data[:]


def load_model(model: Any, max_elements: int) -> Any:
    """``model`` as a ModelProto: a ModelProto (this module's or the onnx package's,
    returned as is), the model's bytes, or a path to a binary .onnx file (its external
    data read from its directory: :func:`load_external_data`). A file that cannot be
    read is an OSError, bytes that do not decode protobuf's DecodeError."""
    if is_message(model, "ModelProto"):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        return ModelProto.FromString(bytes(model))
    path = os.fspath(model)
    with open(path, "rb") as f:
        loaded = ModelProto.FromString(f.read())
    load_external_data(loaded, os.path.dirname(path), max_elements)
    return loaded


# ------------------------------------------------------------------ operator schemas

_MAX = 2147483647  # a variadic input's max in onnx.defs
# per operator of the default domain convengine runs: (since opset, min inputs, max
# inputs), oldest first, as onnx.defs.get_schema(op, opset).min_input / max_input give
# them (tests/test_onnx_proto.py compares them at every opset onnx defines)
_INPUTS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "Add": ((1, 2, 2),), "AveragePool": ((1, 1, 1),), "BatchNormalization": ((1, 5, 5),),
    "Cast": ((1, 1, 1),), "Clip": ((1, 1, 1), (11, 1, 3)), "Concat": ((1, 1, _MAX),),
    "Constant": ((1, 0, 0),), "Conv": ((1, 2, 3),), "ConvInteger": ((10, 2, 4),),
    "ConvTranspose": ((1, 2, 3),), "DequantizeLinear": ((10, 2, 3),), "Div": ((1, 2, 2),),
    "Dropout": ((1, 1, 1), (12, 1, 3)), "Flatten": ((1, 1, 1),), "Gather": ((1, 2, 2),),
    "Gemm": ((1, 3, 3), (11, 2, 3)), "GlobalAveragePool": ((1, 1, 1),),
    "GlobalMaxPool": ((1, 1, 1),), "HardSigmoid": ((1, 1, 1),), "HardSwish": ((14, 1, 1),),
    "Identity": ((1, 1, 1),), "LeakyRelu": ((1, 1, 1),), "MatMul": ((1, 2, 2),),
    "MaxPool": ((1, 1, 1),), "Mul": ((1, 2, 2),),
    "Pad": ((1, 1, 1), (11, 2, 3), (18, 2, 4)), "QLinearConv": ((10, 8, 9),),
    "QLinearMatMul": ((10, 8, 8),), "QuantizeLinear": ((10, 2, 3),),
    "ReduceMean": ((1, 1, 1), (18, 1, 2)), "Relu": ((1, 1, 1),),
    "Reshape": ((1, 1, 1), (5, 2, 2)), "Resize": ((10, 2, 2), (11, 3, 4), (13, 1, 4)),
    "Shape": ((1, 1, 1),), "Sigmoid": ((1, 1, 1),), "Slice": ((1, 1, 1), (10, 3, 5)),
    "Softmax": ((1, 1, 1),), "Squeeze": ((1, 1, 1), (13, 1, 2)), "Sub": ((1, 2, 2),),
    "Tanh": ((1, 1, 1),), "Transpose": ((1, 1, 1),),
    "Unsqueeze": ((1, 1, 1), (13, 2, 2)),
}


def schema_inputs(op: str, opset: int) -> tuple[int, int] | None:
    """(min, max) inputs of the default domain's operator ``op`` at ``opset``; None for
    an operator not in the table or not defined yet at that opset."""
    found = None
    for since, least, most in _INPUTS.get(op, ()):
        if since <= opset:
            found = (least, most)
    return found


def known_ops() -> list[str]:
    """The default domain's operators :func:`schema_inputs` knows."""
    return sorted(_INPUTS)
