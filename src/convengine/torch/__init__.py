"""PyTorch interop: convengine's convolutions as autograd Functions and ``nn`` modules.

    import convengine.torch as cet
    y = cet.conv(x, w, b, stride=2, padding=1)   # differentiable, like F.conv2d
    cet.replace_convs(model)                      # every nn.Conv* now runs on convengine
    fast = cet.optimize(model.eval())             # BN folded, activation/residual fused
    cet.replace_quantized_convs(qmodel)           # FX-quantized convs on convengine int8

CPU tensors only; 2-D and 3-D convs return channels-last memory. Needs the ``torch``
extra (torch==2.13.0). See docs/interop.md.
"""

from .convs import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    conv,
    conv_transpose,
    from_numpy,
    replace_convs,
    to_numpy,
)
from .fused import FusedConv2d
from .optimize import fold_batchnorm, optimize
from .quantized import QConv2d, replace_quantized_convs

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "FusedConv2d",
    "QConv2d",
    "conv",
    "conv_transpose",
    "fold_batchnorm",
    "from_numpy",
    "optimize",
    "replace_convs",
    "replace_quantized_convs",
    "to_numpy",
]
