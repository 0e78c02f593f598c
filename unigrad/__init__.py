"""unigrad: a small tensor compiler implementing the UOp specification."""
from unigrad.dtype import dtypes
from unigrad.frontend.tensor import Tensor
from unigrad.frontend.function import function
from unigrad.frontend.jit import TinyJit
from unigrad.helpers import GlobalCounters
from unigrad.knobs import Context, getenv
from unigrad.runtime.device import Device
from unigrad.uop import UOp
from unigrad.uop.variable import UnboundVariableError, Variable
from unigrad import nn  # noqa: E402 (nn builds on Tensor)
from unigrad import multi  # noqa: E402 (the collectives build on Tensor)
from unigrad import linalg  # noqa: E402 (torch.linalg's functions build on Tensor)
from unigrad.knobs import VIZ
if VIZ:  # trace everything and serve the viewer at exit (unigrad/viz)
  from unigrad.viz.session import install_exit_hook
  install_exit_hook()

__all__ = ["Context", "Device", "GlobalCounters", "Tensor", "TinyJit", "UOp",
           "UnboundVariableError", "Variable", "dtypes", "function", "getenv", "linalg", "multi",
           "nn"]
