"""tinygrad's module path for TinyJit (`from unigrad.jit import TinyJit`; tinygrad also spells it
`tinygrad.engine.jit`, see docs/api.md)."""
from unigrad.frontend.jit import JitError, TinyJit

__all__ = ["JitError", "TinyJit"]
