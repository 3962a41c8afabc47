"""convengine: a convolution engine for Python (N-d conv, its gradients, int8).

The public API is re-exported here; see the README for the tables.
"""

from . import algorithms as _algorithms  # noqa: F401  (registers every algorithm)
from . import config
from ._kernel_cache import KernelCacheWarning
from ._version import __version__
from .api import conv, conv_backward_data, conv_backward_weight, conv_transpose, explain, qconv
from .errors import ConvSetupError
from .exactness import allow_inexact, inexact_allowed
from .graph import Graph, Plan, PlanCache
from .prepared import PreparedConv
from .problem import ConvProblem
from .quant import dequantize, quantize, quantize_per_channel, requantize
from .registry import algorithms as list_algorithms
from .select import Explanation
from .threads import get_num_threads, set_num_threads
from .tune import TuneResult, TuningCacheWarning, get_tuning, set_tuning, tune
from .warmup import warmup

__all__ = [
    "ConvProblem",
    "ConvSetupError",
    "Explanation",
    "Graph",
    "KernelCacheWarning",
    "Plan",
    "PlanCache",
    "PreparedConv",
    "TuneResult",
    "TuningCacheWarning",
    "__version__",
    "config",
    "allow_inexact",
    "conv",
    "conv_backward_data",
    "conv_backward_weight",
    "conv_transpose",
    "dequantize",
    "explain",
    "get_num_threads",
    "get_tuning",
    "inexact_allowed",
    "list_algorithms",
    "qconv",
    "quantize",
    "quantize_per_channel",
    "requantize",
    "set_num_threads",
    "set_tuning",
    "tune",
    "warmup",
]
