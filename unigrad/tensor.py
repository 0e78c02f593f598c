"""tinygrad's module path for Tensor (`from unigrad.tensor import Tensor`)."""
from unigrad.frontend.tensor import Tensor

__all__ = ["Tensor"]
