"""Every bad input gets a clear error that names the argument and the expected value."""

import numpy as np
import pytest

import convengine as ce

X = np.zeros((2, 4, 8, 8), np.float32)
W = np.zeros((6, 4, 3, 3), np.float32)


def err(match):
    return pytest.raises(ce.ConvSetupError, match=match)


def test_setup_error_is_a_value_error():
    assert issubclass(ce.ConvSetupError, ValueError)


@pytest.mark.parametrize("shape", [(4, 8), (1, 2, 3, 4, 5, 6)])
def test_wrong_rank(shape):
    with err(rf"x must have 3, 4 or 5 dims .* got {len(shape)} dims"):
        ce.conv(np.zeros(shape, np.float32), W)


def test_rank_mismatch():
    with err(r"x and w ranks differ: x has shape \(2, 4, 8, 8\) \(4 dims\), w has shape \(6, 4, 3\)"):
        ce.conv(X, np.zeros((6, 4, 3), np.float32))


def test_channels_not_matching_groups():
    with err(r"channel mismatch: w shape \(6, 3, 3, 3\) \(NCHW\) has 3 input channels per group, "
             r"expected C // groups = 4 // 1 = 4"):
        ce.conv(X, np.zeros((6, 3, 3, 3), np.float32))


def test_groups_not_dividing():
    with err(r"groups=3 does not divide the input channels C=4"):
        ce.conv(X, W, groups=3)
    with err(r"groups=2 does not divide the output channels O=5"):
        ce.conv(X, np.zeros((5, 2, 3, 3), np.float32), groups=2)
    with err(r"groups must be >= 1, got 0"):
        ce.conv(X, W, groups=0)


@pytest.mark.parametrize("arg", ["stride", "dilation"])
def test_stride_and_dilation_at_least_one(arg):
    with err(rf"{arg} must be >= 1 in every dim, got \(1, 0\)"):
        ce.conv(X, W, **{arg: (1, 0)})
    with err(rf"{arg} must be an int or 2 ints"):
        ce.conv(X, W, **{arg: (1, 1, 1)})


def test_non_integer_arguments_are_type_errors():
    with pytest.raises(TypeError, match="stride must be an int"):
        ce.conv(X, W, stride=1.5)
    with pytest.raises(TypeError, match="groups must be an int"):
        ce.conv(X, W, groups=True)


def test_negative_padding_and_bad_padding_spellings():
    with err(r"padding must be >= 0, got \(\(-1, -1\), \(-1, -1\)\)"):
        ce.conv(X, W, padding=-1)
    with err(r"unknown padding mode 'full'"):
        ce.conv(X, W, padding="full")
    with err(r"padding must be an int, 2 ints or 2 \(lo, hi\) pairs"):
        ce.conv(X, W, padding=(1, 1, 1))
    with err(r"padding pairs must be \(lo, hi\)"):
        ce.conv(X, W, padding=((1, 1, 1), (0, 0)))


def test_kernel_larger_than_padded_input_names_output_size():
    with err(r"dilated kernel extent 9 > padded input 8 .* the computed output size would be 0"):
        ce.conv(X, W, dilation=4)


def test_backward_shapes_inconsistent_with_dy():
    dy = np.zeros((2, 6, 6, 6), np.float32)
    with err(r"dy has shape \(2, 6, 6, 6\), expected \(2, 6, 7, 7\)"):
        ce.conv_backward_data(dy, W, (2, 4, 9, 9))
    with err(r"dy has shape \(2, 6, 6, 6\), expected \(2, 5, 6, 6\)"):
        ce.conv_backward_weight(X, dy, (5, 4, 3, 3))
    with err(r"channel mismatch: weight_shape"):
        ce.conv_backward_weight(X, dy, (6, 3, 3, 3))
    with pytest.raises(TypeError, match="input_shape must be a sequence of ints"):
        ce.conv_backward_data(dy, W, 5)


def test_transpose_output_padding_must_be_below_stride_or_dilation():
    x, w = np.zeros((1, 4, 5, 5), np.float32), np.zeros((4, 2, 3, 3), np.float32)
    with err(r"output_padding must be smaller than stride or dilation, got output_padding=\(2, 2\), "
             r"stride=\(2, 2\), dilation=\(1, 1\)"):
        ce.conv_transpose(x, w, stride=2, output_padding=2)
    ce.conv_transpose(x, w, stride=1, dilation=2, output_padding=1)  # below dilation: fine
    with err(r"x has shape \(1, 4, 5, 5\), expected \(1, 3, 5, 5\)"):
        ce.conv_transpose(x, np.zeros((3, 2, 3, 3), np.float32))


def test_bias_of_wrong_length_or_dtype():
    with err(r"bias has shape \(5,\), expected \(6,\) \(one value per output channel\)"):
        ce.conv(X, W, np.zeros(5, np.float32))
    with err(r"bias must be a float array, got dtype int64"):
        ce.conv(X, W, np.zeros(6, np.int64))


def test_unknown_algo_layout_and_pass():
    with err(r"unknown algo 'fft' for pass 'forward'; expected 'auto' or one of \[.*'reference'"):
        ce.conv(X, W, algo="fft")
    with err(r"unknown layout 'NWHC'; expected one of \('NCHW', 'NHWC'\)"):
        ce.conv(X, W, layout="NWHC")
    with err(r"unknown pass 'sideways'"):
        ce.list_algorithms("sideways")
    with err(r"unknown pass_ 'sideways'"):
        ce.explain(X, W, pass_="sideways")


def test_forced_algorithm_that_cannot_serve_says_why():
    with err(r"algo '1x1' cannot serve this forward problem: needs a 1x1 kernel"):
        ce.conv(X, W, algo="1x1")
    with err(r"algo 'implicit_gemm' cannot serve this backward_data problem: backward-data with stride"):
        ce.conv_backward_data(np.zeros((2, 6, 3, 3), np.float32), W, X.shape, stride=2, algo="implicit_gemm")


@pytest.mark.parametrize(
    ("x_dtype", "w_dtype", "message"),
    [
        ("float32", "float64", r"mixed float dtypes \(x.dtype=float32, w.dtype=float64\)"),
        ("int8", "int8", r"unsupported dtype x.dtype=int8 \(x.dtype=int8, w.dtype=int8\).*quantized API"),
        ("complex64", "complex64", r"unsupported dtype x.dtype=complex64"),
        ("float32", "int32", r"unsupported dtype w.dtype=int32 \(x.dtype=float32, w.dtype=int32\)"),
    ],
)
def test_dtype_errors_name_both_dtypes(x_dtype, w_dtype, message):
    with err(message):
        ce.conv(X.astype(x_dtype), W.astype(w_dtype))


def test_non_array_input_is_a_type_error():
    with pytest.raises((TypeError, ce.ConvSetupError)):
        ce.conv(object(), W)
