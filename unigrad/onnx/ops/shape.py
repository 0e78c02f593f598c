"""Shape and movement operators: Shape, Reshape, Transpose, Slice, Concat, Split, Pad, Expand,
Tile, Gather/Scatter families, Cast, constants."""
from __future__ import annotations

import math
from typing import Any

from unigrad.onnx.convert import to_tensor
from unigrad.onnx.ops.registry import (Node, Tensor, axis_of, dtypes, check, ints, np, onnx_dtype,
                                       op, scalar, tensor, value_of)


@op("Shape")
def shape(n: Node, x: Any) -> np.ndarray:
  dims = list(x.shape)
  start, end = n.attr("start", 0), n.attr("end", None)
  return np.array(dims[slice(start, end)], dtype=np.int64)


@op("Size")
def size(n: Node, x: Any) -> np.ndarray:
  return np.array(math.prod(x.shape), dtype=np.int64)


@op("Reshape")
def reshape(n: Node, x: Any, shape_in: Any = None) -> Tensor:
  t = tensor(n, x)
  new = ints(n, shape_in, "shape") if n.opset >= 5 else list(n.attr("shape"))
  if not n.attr("allowzero", 0):
    new = [t.shape[i] if d == 0 else d for i, d in enumerate(new)]
  if -1 in new:
    known = math.prod(d for d in new if d != -1)
    new[new.index(-1)] = math.prod(t.shape) // known if known else 0
  return t.reshape(*new)


@op("Flatten")
def flatten(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  axis = axis_of(n.attr("axis", 1), t.ndim)
  return t.reshape(math.prod(t.shape[:axis]), math.prod(t.shape[axis:]))


@op("Squeeze")
def squeeze(n: Node, x: Any, axes_in: Any = None) -> Tensor:
  t = tensor(n, x)
  axes = n.attr("axes", None) if n.opset < 13 else \
    (ints(n, axes_in, "axes") if axes_in is not None else None)
  if axes is None: axes = [i for i, s in enumerate(t.shape) if s == 1]
  axes = {axis_of(a, t.ndim) for a in axes}
  return t.reshape(*[s for i, s in enumerate(t.shape) if i not in axes])


@op("Unsqueeze")
def unsqueeze(n: Node, x: Any, axes_in: Any = None) -> Tensor:
  t = tensor(n, x)
  axes = n.attr("axes") if n.opset < 13 else ints(n, axes_in, "axes")
  ndim = t.ndim + len(axes)
  axes = {axis_of(a, ndim) for a in axes}
  dims = iter(t.shape)
  return t.reshape(*[1 if i in axes else next(dims) for i in range(ndim)])


@op("Transpose")
def transpose(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  perm = n.attr("perm", None) or list(range(t.ndim))[::-1]
  return t.permute(*perm)


@op("Concat")
def concat(n: Node, *xs: Any) -> Tensor:
  ts = [tensor(n, x) for x in xs]
  axis = axis_of(n.attr("axis"), ts[0].ndim)
  ts = [t for t in ts if t.shape[axis] != 0] or ts[:1]
  return ts[0].cat(*ts[1:], dim=axis) if len(ts) > 1 else ts[0]


@op("Split")
def split(n: Node, x: Any, split_in: Any = None) -> tuple[Tensor, ...]:
  t = tensor(n, x)
  axis = axis_of(n.attr("axis", 0), t.ndim)
  dim = t.shape[axis]
  sizes = n.attr("split", None) if n.opset < 13 else \
    (ints(n, split_in, "split") if split_in is not None else None)
  if not sizes:
    parts = n.attr("num_outputs", None) or len(n.outputs)
    each = math.ceil(dim / parts)
    sizes = [min(each, dim - i * each) for i in range(parts)]
  return tuple(_narrow(t, axis, sum(sizes[:i]), s) for i, s in enumerate(sizes))


def _narrow(t: Tensor, axis: int, start: int, length: int) -> Tensor:
  return t.shrink([(start, start + length) if i == axis else None for i in range(t.ndim)])


def slice_axis(t: Tensor, axis: int, start: int, end: int, step: int) -> Tensor:
  """numpy's t[start:end:step] along `axis` (any step but 0)."""
  dim = t.shape[axis]
  s, e, st = slice(start, end, step).indices(dim)
  count = len(range(s, e, st))
  if st < 0:
    t, s, st = t.flip(axis), dim - 1 - s, -st
  if count == 0: return _narrow(t, axis, 0, 0)
  t = _narrow(t, axis, s, min((count - 1) * st + 1, dim - s))
  if st == 1: return t
  pads = [(0, 0)] * t.ndim
  pads[axis] = (0, count * st - t.shape[axis])
  t = t.pad(pads)
  shp = list(t.shape)
  t = t.reshape(*shp[:axis], count, st, *shp[axis + 1:])
  return t.shrink([(0, 1) if i == axis + 1 else None for i in range(t.ndim)]).reshape(
    *shp[:axis], count, *shp[axis + 1:])


@op("Slice")
def slice_(n: Node, x: Any, starts: Any = None, ends: Any = None, axes: Any = None,
           steps: Any = None) -> Tensor:
  t = tensor(n, x)
  if n.opset < 10:
    st, en, ax, sp = n.attr("starts"), n.attr("ends"), n.attr("axes", None), None
  else:
    st, en = ints(n, starts, "starts"), ints(n, ends, "ends")
    ax = ints(n, axes, "axes") if axes is not None else None
    sp = ints(n, steps, "steps") if steps is not None else None
  ax = ax or list(range(len(st)))
  sp = sp or [1] * len(st)
  for a, s, e, step in zip(ax, st, en, sp):
    t = slice_axis(t, axis_of(a, t.ndim), s, e, step)
  return t


def _wrap(idx: Tensor, dim: int) -> Tensor:
  idx = idx.cast(dtypes.int64)
  return (idx < 0).where(idx + dim, idx)


@op("Gather")
def gather(n: Node, x: Any, indices: Any) -> Tensor:
  t = tensor(n, x)
  axis = axis_of(n.attr("axis", 0), t.ndim)
  if isinstance(indices, np.ndarray) and indices.ndim == 0:
    i = int(indices)
    return _narrow(t, axis, i + t.shape[axis] if i < 0 else i, 1).squeeze(axis)
  idx = _wrap(tensor(n, indices), t.shape[axis])
  flat = idx.reshape(-1)
  moved = t.permute(axis, *[i for i in range(t.ndim) if i != axis])
  out = moved[flat]  # (k, rest...)
  rest = [s for i, s in enumerate(t.shape) if i != axis]
  out = out.reshape(*idx.shape, *rest)
  k = idx.ndim
  order = list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, out.ndim))
  return out.permute(*order)


@op("GatherElements")
def gather_elements(n: Node, x: Any, indices: Any) -> Tensor:
  t = tensor(n, x)
  axis = axis_of(n.attr("axis", 0), t.ndim)
  return t.gather(axis, _wrap(tensor(n, indices), t.shape[axis]))


def _linear_index(idx: Tensor, dims: tuple[int, ...]) -> Tensor:
  """Index tuples along the last axis as a flat index into `dims` (negative entries wrap)."""
  k = idx.shape[-1]
  lin = None
  for j in range(k):
    part = _wrap(idx[..., j], dims[j]) * math.prod(dims[j + 1:k])
    lin = part if lin is None else lin + part
  return lin if lin is not None else idx.sum(-1)


@op("GatherND")
def gather_nd(n: Node, x: Any, indices: Any) -> Tensor:
  t, idx = tensor(n, x), tensor(n, indices).cast(dtypes.int64)
  b = n.attr("batch_dims", 0)
  k = idx.shape[-1]
  bshape, dims, rest = t.shape[:b], t.shape[b:b + k], t.shape[b + k:]
  bp, m = math.prod(bshape), math.prod(idx.shape[b:-1])
  data = t.reshape(bp, math.prod(dims), *rest)
  lin = _linear_index(idx.reshape(bp, m, k), dims)
  bidx = Tensor.arange(bp, device=t.device).reshape(bp, 1).expand(bp, m)
  return data[bidx, lin].reshape(*idx.shape[:-1], *rest)


_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@op("ScatterElements", "Scatter")
def scatter_elements(n: Node, x: Any, indices: Any, updates: Any) -> Tensor:
  t, upd = tensor(n, x), tensor(n, updates)
  axis = axis_of(n.attr("axis", 0), t.ndim)
  idx = _wrap(tensor(n, indices), t.shape[axis])
  red = n.attr("reduction", "none")
  if red == "none": return t.scatter(axis, idx, upd)
  return t.scatter_reduce(axis, idx, upd, _REDUCE[red], include_self=True)


@op("ScatterND")
def scatter_nd(n: Node, x: Any, indices: Any, updates: Any) -> Tensor:
  t, idx, upd = tensor(n, x), tensor(n, indices).cast(dtypes.int64), tensor(n, updates)
  k = idx.shape[-1]
  dims, rest = t.shape[:k], t.shape[k:]
  m, restp = math.prod(idx.shape[:-1]), math.prod(rest)
  data = t.reshape(math.prod(dims), restp)
  lin = _linear_index(idx.reshape(m, k), dims).reshape(m, 1).expand(m, restp)
  upd = upd.reshape(m, restp)
  red = n.attr("reduction", "none")
  out = data.scatter(0, lin, upd) if red == "none" else \
    data.scatter_reduce(0, lin, upd, _REDUCE[red], include_self=True)
  return out.reshape(t.shape)


@op("Expand")
def expand(n: Node, x: Any, shape_in: Any) -> Tensor:
  t = tensor(n, x)
  target = np.broadcast_shapes(tuple(t.shape), tuple(ints(n, shape_in, "shape")))
  return t.reshape(*([1] * (len(target) - t.ndim)), *t.shape).expand(*target)


@op("Tile")
def tile(n: Node, x: Any, repeats: Any) -> Tensor:
  t = tensor(n, x)
  return t.repeat(*ints(n, repeats, "repeats"))


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate",
              "wrap": "circular"}


@check("Pad")
def check_pad(n: Node) -> str | None:
  mode = n.attr("mode", "constant")
  return None if mode in _PAD_MODES else f"mode {mode!r} is not one of {list(_PAD_MODES)}"


@op("Pad")
def pad(n: Node, x: Any, pads_in: Any = None, value: Any = None, axes_in: Any = None) -> Tensor:
  t = tensor(n, x)
  if n.opset < 11: pads, cval = list(n.attr("pads", n.attr("paddings"))), n.attr("value", 0.0)
  else:
    pads = ints(n, pads_in, "pads")
    cval = value
  axes = ints(n, axes_in, "axes") if axes_in is not None else list(range(t.ndim))
  axes = [axis_of(a, t.ndim) for a in axes]
  per = [(0, 0)] * t.ndim
  for j, a in enumerate(axes): per[a] = (pads[j], pads[j + len(axes)])
  mode = _PAD_MODES[n.attr("mode", "constant")]
  if mode != "constant": return t.pad(per, mode=mode)
  if cval is None: return t.pad(per)
  if isinstance(cval, (int, float)): return t.pad(per, value=cval)
  if isinstance(cval, np.ndarray): return t.pad(per, value=cval.reshape(-1)[0].item())
  cv = tensor(n, cval).reshape(())
  mask = Tensor.ones(*t.shape, dtype=dtypes.bool, device=t.device).pad(per)
  return mask.where(t.pad(per), cv.cast(t.dtype))


@op("Constant")
def constant(n: Node) -> np.ndarray:
  for key, kind in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                    ("value_int", np.int64), ("value_ints", np.int64)):
    if key in n.attrs: return np.array(n.attrs[key], dtype=kind)
  raise n.error(f"unsupported attribute {', '.join(n.attrs)}")


@op("ConstantOfShape")
def constant_of_shape(n: Node, shape_in: Any) -> np.ndarray:
  v = n.attr("value", np.zeros(1, np.float32))
  return np.full(ints(n, shape_in, "shape"), v.reshape(-1)[0], dtype=v.dtype)


@op("Range")
def range_(n: Node, start: Any, limit: Any, delta: Any) -> np.ndarray:
  s, lim, d = (value_of(n, v, "range") for v in (start, limit, delta))
  return np.arange(s, lim, d).astype(s.dtype)


def cast_fp8(t: Tensor, dt: Any, saturate: bool) -> Tensor:
  """ONNX's cast to an 8-bit float: saturate clamps (infinities too) to the largest finite
  value; without it, e4m3fn turns what rounds past 448 into NaN (unigrad's cast, PyTorch's,
  saturates e4m3fn and overflows the others as ONNX does)."""
  if not dtypes.is_float(t.dtype): return t.cast(dt)
  big = dtypes.finfo(dt).max
  if saturate: t = t.isnan().where(t, t.clamp(-big, big))
  elif dt == dtypes.fp8e4m3: t = (t.abs() > 464).where(math.nan, t)
  return t.cast(dt)


@op("Cast")
def cast(n: Node, x: Any) -> Any:
  dt = onnx_dtype(n.attr("to"))
  t = tensor(n, x)
  if dtypes.is_fp8(dt): return cast_fp8(t, dt, bool(n.attr("saturate", 1)))
  return t.cast(dt)


@op("CastLike")
def cast_like(n: Node, x: Any, like: Any) -> Tensor:
  dt = like.dtype if isinstance(like, Tensor) else tensor(n, like).dtype
  if dtypes.is_fp8(dt): return cast_fp8(tensor(n, x), dt, bool(n.attr("saturate", 1)))
  return tensor(n, x).cast(dt)


@op("DepthToSpace")
def depth_to_space(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  b, (N, C, H, W) = n.attr("blocksize"), t.shape
  if n.attr("mode", "DCR") == "DCR":
    t = t.reshape(N, b, b, C // (b * b), H, W).permute(0, 3, 4, 1, 5, 2)
  else: t = t.reshape(N, C // (b * b), b, b, H, W).permute(0, 1, 4, 2, 5, 3)
  return t.reshape(N, C // (b * b), H * b, W * b)


@op("SpaceToDepth")
def space_to_depth(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  b, (N, C, H, W) = n.attr("blocksize"), t.shape
  t = t.reshape(N, C, H // b, b, W // b, b)
  t = t.permute(0, 1, 3, 5, 2, 4) if n.attr("mode", "DCR") == "CRD" else t.permute(0, 3, 5, 1, 2, 4)
  return t.reshape(N, C * b * b, H // b, W // b)


@op("EyeLike")
def eye_like(n: Node, x: Any) -> np.ndarray:
  from unigrad.onnx.convert import numpy_dtype_of  # noqa: PLC0415 (keeps the import list short)
  dt = onnx_dtype(n.attr("dtype")) if "dtype" in n.attrs else \
    (x.dtype if isinstance(x, Tensor) else None)
  np_dt = numpy_dtype_of(dt) if dt is not None else x.dtype
  return np.eye(x.shape[0], x.shape[1], k=n.attr("k", 0), dtype=np_dt)


@op("OneHot")
def one_hot(n: Node, indices: Any, depth: Any, values: Any) -> Tensor:
  idx = tensor(n, indices)
  d = int(scalar(n, depth, "depth"))
  vals = tensor(n, values)
  idx = idx.cast(dtypes.int64) if not dtypes.is_float(idx.dtype) else idx.floor().cast(dtypes.int64)
  idx = (idx < 0).where(idx + d, idx)
  axis = axis_of(n.attr("axis", -1), idx.ndim + 1)
  hot = idx.unsqueeze(-1) == Tensor.arange(d, device=idx.device)
  out = hot.where(vals[1], vals[0])
  order = list(range(idx.ndim))
  order.insert(axis, idx.ndim)
  return out.permute(*order)


@op("Trilu")
def trilu(n: Node, x: Any, k: Any = None) -> Tensor:
  t = tensor(n, x)
  kk = int(scalar(n, k, "k")) if k is not None else 0
  return t.triu(kk) if n.attr("upper", 1) else t.tril(kk)


@op("ReverseSequence")
def reverse_sequence(n: Node, x: Any, lens: Any) -> Tensor:
  t, seq = tensor(n, x), tensor(n, lens).cast(dtypes.int64)
  ba, ta = n.attr("batch_axis", 1), n.attr("time_axis", 0)
  steps = t.shape[ta]
  shp = [1] * t.ndim
  shp[ta] = steps
  tt = Tensor.arange(steps, device=t.device).reshape(*shp)
  bshp = [1] * t.ndim
  bshp[ba] = t.shape[ba]
  ln = seq.reshape(*bshp)
  src = (tt < ln).where(ln - 1 - tt, tt).expand(*t.shape)
  return t.gather(ta, src)


@op("CenterCropPad")
def center_crop_pad(n: Node, x: Any, shape_in: Any) -> Tensor:
  t = tensor(n, x)
  target = ints(n, shape_in, "shape")
  axes = [axis_of(a, t.ndim) for a in (n.attr("axes", None) or range(t.ndim))]
  for a, want in zip(axes, target):
    have = t.shape[a]
    if have > want:
      start = (have - want) // 2
      t = _narrow(t, a, start, want)
    elif have < want:
      pads = [(0, 0)] * t.ndim
      before = (want - have) // 2
      pads[a] = (before, want - have - before)
      t = t.pad(pads)
  return t


@op("NonZero")
def nonzero(n: Node, x: Any) -> np.ndarray:
  return np.array(np.nonzero(value_of(n, x, "input")), dtype=np.int64)


@op("Compress")
def compress(n: Node, x: Any, cond: Any) -> Tensor:
  t = tensor(n, x)
  c = value_of(n, cond, "condition").astype(bool)
  keep = np.nonzero(c)[0].astype(np.int64)
  axis = n.attr("axis", None)
  if axis is None: t, axis = t.reshape(-1), 0
  return gather(Node("Gather", "", 13, n.name, [], [], {"axis": axis}, n.device, n.eager), t,
                keep)


@op("Unique")
def unique(n: Node, x: Any) -> tuple[Any, ...]:
  arr = value_of(n, x, "input")
  axis = n.attr("axis", None)
  vals, idx, inv, counts = np.unique(arr, return_index=True, return_inverse=True,
                                     return_counts=True, axis=axis)
  if not n.attr("sorted", 1):
    order = np.argsort(idx, kind="stable")
    vals = np.take(vals, order, axis=axis if axis is not None else 0)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    idx, counts, inv = idx[order], counts[order], rank[inv.reshape(-1)]
  to64 = lambda a: np.asarray(a, dtype=np.int64).reshape(-1)  # noqa: E731
  return vals, to64(idx), to64(inv), to64(counts)


__all__ = ["slice_axis", "to_tensor"]
