"""unigrad.export: a traced function as one standalone C source (seed 003, NumericalFunction).

  nf = NumericalFunction(model_forward, ((1, 64), dtypes.float32), name="digits")
  open("digits.c", "w").write(nf.source)   # void digits(const float *in0, float *out0);
  logits = nf(x)                           # compiled with the system C compiler, run natively

`vmap(fn, in_axes)` maps a function over a batch axis (traced once); `svmap` is the map whose
exported batch size is a runtime argument.
"""
from unigrad.export.lower import Category
from unigrad.export.numerical import NumericalFunction
from unigrad.export.trace import ExportError, TensorSpec
from unigrad.export.vmap import VmapError, batch_body, svmap, vmap

__all__ = ["Category", "ExportError", "NumericalFunction", "TensorSpec", "VmapError",
           "batch_body", "svmap", "vmap"]
