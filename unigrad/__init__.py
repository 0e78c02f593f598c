"""unigrad: a small tensor compiler implementing the UOp specification."""
from unigrad.dtype import dtypes
from unigrad.knobs import Context
from unigrad.uop import UOp

__all__ = ["Context", "UOp", "dtypes"]
