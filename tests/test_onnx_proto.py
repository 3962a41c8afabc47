"""convengine.onnx.proto: reading ONNX protobufs without importing the onnx package.

Checked against onnx itself (imported here, in the test process): the dtype table,
tensors to arrays for every data type and storage field, attribute values, the
operator arity table against onnx.defs; external data read only from inside the
model's directory; and, in fresh subprocesses, that a Session answers without onnx or
ml_dtypes in sys.modules, and that the standalone protobuf module and onnx's coexist
in either import order."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import convengine as ce  # noqa: E402
import convengine.onnx as ceo  # noqa: E402
from convengine.onnx import proto  # noqa: E402

try:
    from onnx import _mapping

    TYPES = sorted(_mapping.TENSOR_TYPE_MAP)
except ImportError:  # an onnx without the private table: the public enum
    TYPES = [v for v in TensorProto.DataType.values() if v]


def _child(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout (a failure shows its stderr)."""
    env = {**os.environ, "CONVENGINE_TUNING": "cache-only"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# ------------------------------------------------------------------ models


def _conv_relu_model(w, b):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w.shape[1], 6, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
            rng.standard_normal(4).astype(np.float32))


def _reference(x, w, b):
    """Conv (pads 1, stride 1) + Relu in float64."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    n, _, h, wd = x.shape
    y = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            y += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return np.maximum(y + b.reshape(1, -1, 1, 1), 0)


def _external_model(folder, w, b, location="w.bin", offset=0, length=None, data=None):
    """The Conv + Relu model at ``folder/model.onnx`` with ``w`` in the external file
    ``location`` (written with ``data``, default w's bytes at ``offset``, unless None is
    given for data and the file is left as is)."""
    model = _conv_relu_model(w, b)
    t = next(t for t in model.graph.initializer if t.name == "w")
    raw = t.raw_data
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for key, value in entries.items():
        t.external_data.add(key=key, value=value)
    if data is not False and not os.path.isabs(location) and ".." not in location:
        target = os.path.join(folder, location)
        if not os.path.lexists(target):
            with open(target, "wb") as f:
                f.write(b"\0" * offset + raw if data is None else data)
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


# ------------------------------------------------------------------ no onnx import


def test_session_answers_without_importing_onnx(tmp_path):
    """A model file with an initializer, and one with external data, load and run in a
    process that never imports onnx (nor ml_dtypes); the outputs match a float64
    reference computed there."""
    w, b = _weights()
    plain = tmp_path / "plain.onnx"
    plain.write_bytes(_conv_relu_model(w, b).SerializeToString())
    ext_dir = tmp_path / "ext"
    ext_dir.mkdir()
    onnx.save_model(_conv_relu_model(w, b), ext_dir / "model.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert (ext_dir / "weights.bin").stat().st_size == w.nbytes + b.nbytes
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "b.npy", b)
    out = _child(f"""
        import sys
        import numpy as np
        import convengine.onnx as ceo

        w, b = np.load({str(tmp_path / 'w.npy')!r}), np.load({str(tmp_path / 'b.npy')!r})
        x = np.random.default_rng(1).standard_normal((1, 3, 6, 7)).astype(np.float32)
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        ref = np.zeros((1, 4, 6, 7))
        for i in range(3):
            for j in range(3):
                ref += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 6, j:j + 7], w[:, :, i, j])
        ref = np.maximum(ref + b.reshape(1, -1, 1, 1), 0)
        for path in ({str(plain)!r}, {str(ext_dir / 'model.onnx')!r}):
            (y,) = ceo.Session(path).run(None, {{"x": x}})
            assert y.shape == ref.shape and y.dtype == np.float32, (y.shape, y.dtype)
            assert np.abs(y - ref).max() < 1e-4, np.abs(y - ref).max()
            (y2,) = ceo.run_model(path, [x])
            assert np.array_equal(y, y2)
        with open({str(plain)!r}, "rb") as f:
            (y3,) = ceo.Session(f.read()).run(None, {{"x": x}})
        assert np.abs(y3 - ref).max() < 1e-4
        assert "onnx" not in sys.modules, "onnx imported"
        assert "ml_dtypes" not in sys.modules, "ml_dtypes imported"
        assert not any(m.startswith("onnx.") for m in sys.modules)
        print("ok")
        """)
    assert out.strip().endswith("ok")


@pytest.mark.parametrize("order", ["standalone_first", "onnx_first"])
def test_protobuf_module_and_onnx_coexist(order, tmp_path):
    """The standalone protobuf module, then onnx (or onnx, then convengine.onnx): both
    work in one process; messages made by onnx are accepted by Session and run_node,
    and onnx reads models made by ours."""
    first, second = ("import convengine.onnx as ceo", "import onnx") \
        if order == "standalone_first" else ("import onnx", "import convengine.onnx as ceo")
    out = _child(f"""
        import sys
        import numpy as np
        {first}
        {second}
        from onnx import TensorProto, helper, numpy_helper
        from convengine.onnx import proto

        standalone = "onnx" not in proto.pb2.__name__ or proto.pb2 is not sys.modules.get(
            "onnx.onnx_ml_pb2")
        assert standalone == ({order!r} == "standalone_first"), proto.pb2.__name__
        w = np.ones((2, 1, 1, 1), np.float32)
        graph = helper.make_graph(
            [helper.make_node("Conv", ["x", "w"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(w, "w")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
        (y,) = ceo.Session(model).run(None, {{"x": x}})
        assert np.array_equal(y, np.concatenate([x, x], axis=1))
        (y,) = ceo.run_node(graph.node[0], [x, w])
        assert y.shape == (1, 2, 2, 2)
        ours = proto.ModelProto.FromString(model.SerializeToString())
        back = onnx.load_from_string(ours.SerializeToString())
        assert back == model and type(back) is type(model)
        print("ok")
        """)
    assert out.strip().endswith("ok")


# ------------------------------------------------------------------ data types


def test_dtype_table_matches_onnx():
    for code in TYPES:
        expected = helper.tensor_dtype_to_np_dtype(code)
        assert proto.np_dtype(code) == expected, code
        assert proto.type_name(code) == TensorProto.DataType.Name(code)
    for code in (0, 99, -1):
        with pytest.raises(KeyError):
            proto.np_dtype(code)


def _random_values(code, count, rng):
    """``count`` random values of the data type ``code`` (an array of its dtype)."""
    dtype = helper.tensor_dtype_to_np_dtype(code)
    if dtype == np.bool_:
        return rng.random(count) < 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, endpoint=True, dtype=dtype)
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(dtype)
    if dtype.kind in "iu" or dtype.name.startswith(("int", "uint")):  # ml_dtypes' ints
        bits = int(dtype.name.removeprefix("u").removeprefix("int"))
        low, high = (0, 2 ** bits - 1) if dtype.name.startswith("u") else \
            (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return rng.integers(low, high, count, endpoint=True).astype(dtype)
    return (rng.standard_normal(count) * 3).astype(np.float32).astype(dtype)


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("code", [c for c in TYPES if c != TensorProto.STRING],
                         ids=lambda c: TensorProto.DataType.Name(c))
@pytest.mark.parametrize("dims", [[3, 5], [4], [], [2, 0, 3], [1, 7]])
def test_to_array_matches_onnx(code, dims):
    """Every data type, from raw_data and from its typed field, odd and empty shapes:
    the same dtype, shape and bytes as onnx.numpy_helper.to_array."""
    rng = np.random.default_rng(code * 100 + len(dims))
    values = _random_values(code, int(np.prod(dims)), rng).reshape(dims)
    raw = helper.make_tensor("t", code, dims, values.tobytes() if code not in (
        TensorProto.UINT4, TensorProto.INT4, TensorProto.FLOAT4E2M1, TensorProto.UINT2,
        TensorProto.INT2, TensorProto.FLOAT6E2M3, TensorProto.FLOAT6E3M2)
        else numpy_helper.from_array(values).raw_data, raw=True)
    typed = helper.make_tensor("t", code, dims, values.flatten())
    assert raw.HasField("raw_data") and not typed.HasField("raw_data")
    for t in (raw, typed):
        expected = numpy_helper.to_array(t)
        got = proto.to_array(t)
        assert _same(got, expected), (TensorProto.DataType.Name(code), got, expected)
        assert _same(got, values.astype(got.dtype)) or np.isnan(
            values.astype(np.float64)).any(), (got, values)


@pytest.mark.parametrize("code", [TensorProto.FLOAT, TensorProto.INT64, TensorProto.UINT8,
                                  TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.UINT32,
                                  TensorProto.INT4, TensorProto.COMPLEX64])
def test_to_array_refuses_data_that_does_not_match_the_dims(code):
    values = _random_values(code, 6, np.random.default_rng(0))
    typed = helper.make_tensor("t", code, [2, 3], values.flatten())
    raw = helper.make_tensor("t", code, [2, 3], numpy_helper.from_array(values).raw_data,
                             raw=True)
    for t in (typed, raw):
        t.dims[1] = 4
        with pytest.raises(ce.ConvSetupError, match=r"initializer 'q'.*\[2, 4\]"):
            proto.to_array(t, "initializer 'q'")


def test_to_array_refuses_strings_unknown_types_segments_and_external():
    t = helper.make_tensor("s", TensorProto.STRING, [1], [b"a"])
    with pytest.raises(ce.ConvSetupError, match="'s'.*string"):
        proto.to_array(t, "tensor 's'")
    t = helper.make_tensor("u", TensorProto.FLOAT, [1], [1.0])
    t.data_type = 77
    with pytest.raises(ce.ConvSetupError, match="data_type 77"):
        proto.to_array(t, "tensor 'u'")
    t = helper.make_tensor("g", TensorProto.FLOAT, [1], [1.0])
    t.segment.begin = 0
    with pytest.raises(ce.ConvSetupError, match="segment"):
        proto.to_array(t, "tensor 'g'")
    t = helper.make_tensor("e", TensorProto.FLOAT, [1], [1.0])
    t.data_location = TensorProto.EXTERNAL
    with pytest.raises(ce.ConvSetupError, match="external"):
        proto.to_array(t, "tensor 'e'")


# ------------------------------------------------------------------ attributes


def test_attribute_values_match_onnx():
    rng = np.random.default_rng(3)
    graph = helper.make_graph([helper.make_node("Relu", ["a"], ["b"])], "sub", [], [])
    tensor = numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "t")
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5, 2.5], np.float32), "v"),
        numpy_helper.from_array(np.array([0, 3], np.int64), "i"), [4])
    attributes = [
        helper.make_attribute("f", float(rng.standard_normal())),
        helper.make_attribute("i", int(rng.integers(-(2 ** 40), 2 ** 40))),
        helper.make_attribute("s", "same_upper"),
        helper.make_attribute("t", tensor),
        helper.make_attribute("st", sparse),
        helper.make_attribute("g", graph),
        helper.make_attribute("tp", helper.make_tensor_type_proto(TensorProto.FLOAT, [2])),
        helper.make_attribute("fs", [float(v) for v in rng.standard_normal(3)]),
        helper.make_attribute("is", [int(v) for v in rng.integers(-9, 9, 4)]),
        helper.make_attribute("ss", ["a", "bc"]),
        helper.make_attribute("ts", [tensor, tensor]),
        helper.make_attribute("sts", [sparse]),
        helper.make_attribute("gs", [graph, graph]),
        helper.make_attribute("tps", [helper.make_tensor_type_proto(TensorProto.INT8, [1])]),
        helper.make_attribute("empty_ints", [], attr_type=onnx.AttributeProto.INTS),
    ]
    undefined = onnx.AttributeProto(name="u")
    for a in [*attributes, undefined]:
        expected = helper.get_attribute_value(a)
        got = proto.attribute_value(a)
        assert type(got) is type(expected) and got == expected, (a.name, got, expected)
    ref = onnx.AttributeProto(name="r", ref_attr_name="alpha", type=onnx.AttributeProto.FLOAT)
    with pytest.raises(ValueError):
        helper.get_attribute_value(ref)
    with pytest.raises(ValueError, match="alpha"):
        proto.attribute_value(ref)
    node = helper.make_node("Constant", [], ["c"], value=tensor)
    node.attribute.extend(attributes[:3])
    attrs = ceo.attributes(node)
    assert np.array_equal(attrs["value"], numpy_helper.to_array(tensor))
    assert attrs["s"] == "same_upper" and attrs["i"] == attributes[1].i


# ------------------------------------------------------------------ operator arity


def test_arity_table_matches_onnx_defs():
    """Every default-domain operator convengine registers has (min, max) inputs in
    the table, equal to onnx.defs at every opset onnx defines (None where onnx has no
    schema yet)."""
    ops = [op for op in ceo.supported_ops() if "::" not in op]
    assert sorted(ops) == proto.known_ops()
    latest = onnx.defs.onnx_opset_version()
    for op in ops:
        for opset in range(1, latest + 3):
            try:
                schema = onnx.defs.get_schema(op, opset, "")
                expected = (schema.min_input, schema.max_input)
            except Exception:
                expected = None
            assert proto.schema_inputs(op, opset) == expected, (op, opset)
    assert proto.schema_inputs("NotAnOp", 17) is None


def test_arity_is_checked():
    w, b = _weights()
    model = _conv_relu_model(w, b)
    model.graph.node[1].input.append("x")  # Relu takes one input
    with pytest.raises(ce.ConvSetupError, match=r"Relu.*takes 1 to 1"):
        ceo.Session(model)


# ------------------------------------------------------------------ external data


def test_external_data_loads_like_onnx(tmp_path):
    w, b = _weights()
    path = _external_model(tmp_path, w, b, offset=24, length=w.nbytes)
    loaded = proto.load_model(path, 10 ** 9)
    expected = onnx.load(path)
    assert loaded.SerializeToString() == expected.SerializeToString()
    x = np.random.default_rng(2).standard_normal((1, 3, 6, 7)).astype(np.float32)
    (y,) = ceo.Session(path).run(None, {"x": x})
    np.testing.assert_allclose(y, _reference(x, w, b), rtol=1e-5, atol=1e-5)
    (y,) = ceo.Session(_external_model(tmp_path, w, b, location="w2.bin")).run(None, {"x": x})
    np.testing.assert_allclose(y, _reference(x, w, b), rtol=1e-5, atol=1e-5)


def _outside(tmp_path, w):
    """A directory ``model`` for the model, and beside it a valid weight file
    ``outside.bin``: reading it would succeed, so each refusal below is the check's."""
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside.bin").write_bytes(w.tobytes())
    return folder


def _refused(path, *patterns):
    with pytest.raises(ce.ConvSetupError) as info:
        ceo.Session(path)
    message = str(info.value)
    for pattern in ["initializer 'w'", *patterns]:
        assert pattern in message, (pattern, message)


def test_external_data_outside_the_directory_is_refused(tmp_path):
    w, b = _weights()
    folder = _outside(tmp_path, w)
    for location in ("../outside.bin", "sub/../../outside.bin", str(tmp_path / "outside.bin")):
        _refused(_external_model(folder, w, b, location=location), repr(location),
                 "not a relative path inside")
    os.symlink(tmp_path / "outside.bin", folder / "link.bin")
    _refused(_external_model(folder, w, b, location="link.bin"), "leads out of")
    os.symlink(tmp_path, folder / "up")
    _refused(_external_model(folder, w, b, location="up/outside.bin"), "leads out of")
    # a link inside the directory is followed
    os.symlink(folder / "w.bin", folder / "inside.bin")
    _external_model(folder, w, b)
    ceo.Session(_external_model(folder, w, b, location="inside.bin"))


@pytest.mark.parametrize("case", ["missing", "offset beyond", "length beyond", "length short",
                                  "file short", "negative offset", "bad offset", "directory"])
def test_external_data_bad_files_and_ranges_are_refused(tmp_path, case):
    w, b = _weights()
    size = w.nbytes
    if case == "missing":
        path, pattern = _external_model(tmp_path, w, b, location="none.bin", data=False), \
            "cannot be opened"
    elif case == "offset beyond":
        (tmp_path / "w.bin").write_bytes(w.tobytes())
        path, pattern = _external_model(tmp_path, w, b, offset=size + 1), \
            f"offset {size + 1:,} is beyond the end"
    elif case == "length beyond":
        (tmp_path / "w.bin").write_bytes(w.tobytes())
        path, pattern = _external_model(tmp_path, w, b, offset=4, length=size), \
            f"length {size:,} is beyond the end"
    elif case == "length short":
        path, pattern = _external_model(tmp_path, w, b, length=size - 4), \
            "bytes of external data"
    elif case == "file short":
        path, pattern = _external_model(tmp_path, w, b, data=w.tobytes()[:-4]), \
            "bytes of external data"
    elif case == "negative offset":
        (tmp_path / "w.bin").write_bytes(w.tobytes())
        path, pattern = _external_model(tmp_path, w, b, offset=-4), "negative"
    elif case == "bad offset":
        path = _external_model(tmp_path, w, b)
        model = onnx.load(path, load_external_data=False)
        model.graph.initializer[0].external_data[1].value = "4x"
        onnx.save_model(model, path)
        pattern = "not an integer"
    else:
        (tmp_path / "d.bin").mkdir()
        path, pattern = _external_model(tmp_path, w, b, location="d.bin", data=False), \
            "regular file"
    _refused(path, pattern)


def test_external_data_huge_dims_refused_before_reading(tmp_path):
    w, b = _weights()
    path = _external_model(tmp_path, w, b)
    model = onnx.load(path, load_external_data=False)
    model.graph.initializer[0].dims[0] = 2 ** 40
    onnx.save_model(model, path)
    _refused(path, "allowed")


def test_external_data_without_a_path_is_refused(tmp_path):
    """Bytes or a ModelProto whose tensors point at external files: refused (never read
    from the working directory), as before."""
    w, b = _weights()
    path = _external_model(tmp_path, w, b)
    with open(path, "rb") as f:
        data = f.read()
    cwd = os.getcwd()
    os.chdir(tmp_path)  # w.bin is right here: still not read
    try:
        for model in (data, onnx.load(path, load_external_data=False)):
            with pytest.raises(ce.ConvSetupError, match="initializer 'w'.*external file"):
                ceo.Session(model)
    finally:
        os.chdir(cwd)


def test_a_damaged_file_names_it(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\x08\x07\x12\xff\xff")
    with pytest.raises(ce.ConvSetupError, match=r"broken\.onnx.*not a valid ONNX model"):
        ceo.Session(path)
    with pytest.raises(ce.ConvSetupError, match=r"cannot be read"):
        ceo.Session(tmp_path / "absent.onnx")
    with pytest.raises(TypeError, match="ModelProto"):
        ceo.Session(3.5)
