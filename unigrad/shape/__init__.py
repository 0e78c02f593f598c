"""Views and shape trackers (spec 004): how a tensor's indices map to positions of a flat buffer.

`View` is one strided, offset, masked window; `ShapeTracker` is a stack of Views for what one
View cannot express. Both give the index and validity expressions (`to_indexed_uops`) that
rangeify builds for the same movement ops; the frontend uses them for `Tensor.stride()`,
`as_strided` and zero-copy export (numpy, DLPack).
"""
from unigrad.shape.shapetracker import ShapeTracker, view_chain
from unigrad.shape.view import View, strides_for_shape

__all__ = ["ShapeTracker", "View", "strides_for_shape", "view_chain"]
