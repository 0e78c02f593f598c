"""Control flow (If, Loop, Scan) over subgraphs, sequences and optionals.

A subgraph runs through the graph runner the node carries (`node.attrs["__run__"]`), in a scope
that sees the outer graph's values. If with a static condition runs one branch; with a computed
one it runs both and selects (the branches' outputs must have the same shapes). Loop unrolls its
iterations (its trip count and condition must be known: static values, or read in an eager
run); Scan unrolls over the scanned axis."""
from __future__ import annotations

from typing import Any

from unigrad.onnx.ops.registry import Node, Tensor, axis_of, dtypes, np, op, scalar, tensor
from unigrad.onnx.graph import value_of


def _run(n: Node, g: Any, values: dict[str, Any]) -> list[Any]:
  return n.attrs["__run__"](g, values)


def _select(n: Node, c: Tensor, a: Any, b: Any) -> Any:
  if isinstance(a, list): return [_select(n, c, x, y) for x, y in zip(a, b)]
  if a is None: return None
  return c.where(tensor(n, a), tensor(n, b))


@op("If")
def if_(n: Node, cond: Any) -> tuple[Any, ...]:
  if isinstance(cond, np.ndarray) or n.eager:
    branch = n.attr("then_branch") if bool(value_of(n, cond, "cond").reshape(-1)[0]) else \
      n.attr("else_branch")
    return tuple(_run(n, branch, {}))
  c = tensor(n, cond).reshape(())
  then, other = _run(n, n.attr("then_branch"), {}), _run(n, n.attr("else_branch"), {})
  return tuple(_select(n, c.cast(dtypes.bool), a, b) for a, b in zip(then, other))


@op("Loop")
def loop(n: Node, trip: Any, cond: Any, *carried: Any) -> tuple[Any, ...]:
  body = n.attr("body")
  names = [i.name for i in body.input]
  max_trip = int(scalar(n, trip, "M")) if trip is not None else None
  keep_going = bool(value_of(n, cond, "cond").reshape(-1)[0]) if cond is not None else True
  state = list(carried)
  scans: list[list[Any]] = []
  i = 0
  while keep_going and (max_trip is None or i < max_trip):
    values = {names[0]: np.array(i, dtype=np.int64),
              names[1]: np.array(keep_going)}
    values.update(zip(names[2:], state))
    outs = _run(n, body, values)
    keep_going = bool(value_of(n, outs[0], "cond").reshape(-1)[0])
    state = outs[1:1 + len(state)]
    scans.append(outs[1 + len(state):])
    i += 1
  k = len(n.outputs) - len(state)
  stacked = []
  for j in range(k):
    parts = [tensor(n, s[j]) for s in scans]
    if parts: stacked.append(Tensor.stack(*parts) if len(parts) > 1 else parts[0].unsqueeze(0))
    else: stacked.append(np.zeros((0,), np.float32))
  return (*state, *stacked)


@op("Scan")
def scan(n: Node, *xs: Any) -> tuple[Any, ...]:
  body = n.attr("body")
  if n.opset < 9: raise n.error("Scan before opset 9 (with sequence_lens) is not supported")
  m = n.attr("num_scan_inputs")
  state, inputs = list(xs[:len(xs) - m]), [tensor(n, x) for x in xs[len(xs) - m:]]
  in_axes = n.attr("scan_input_axes", None) or [0] * m
  in_dirs = n.attr("scan_input_directions", None) or [0] * m
  in_axes = [axis_of(a, t.ndim) for a, t in zip(in_axes, inputs)]
  steps = inputs[0].shape[in_axes[0]] if inputs else 0
  names = [i.name for i in body.input]
  scans: list[list[Tensor]] = []
  for s in range(steps):
    values = dict(zip(names, state))
    for name, t, a, d in zip(names[len(state):], inputs, in_axes, in_dirs):
      j = steps - 1 - s if d else s
      values[name] = t.shrink([(j, j + 1) if k == a else None for k in range(t.ndim)]).squeeze(a)
    outs = _run(n, body, values)
    state = outs[:len(state)]
    scans.append([tensor(n, o) for o in outs[len(state):]])
  k = len(n.outputs) - len(state)
  out_axes = n.attr("scan_output_axes", None) or [0] * k
  out_dirs = n.attr("scan_output_directions", None) or [0] * k
  stacked = []
  for j in range(k):
    parts = [sc[j] for sc in scans]
    if out_dirs[j]: parts = parts[::-1]
    st = Tensor.stack(*parts) if len(parts) > 1 else parts[0].unsqueeze(0)
    a = axis_of(out_axes[j], st.ndim)
    stacked.append(st.permute(*range(1, a + 1), 0, *range(a + 1, st.ndim)))
  return (*state, *stacked)


# ---- sequences: Python lists of values ----

@op("SequenceEmpty")
def sequence_empty(n: Node) -> list[Any]: return []


@op("SequenceConstruct")
def sequence_construct(n: Node, *xs: Any) -> list[Any]: return list(xs)


@op("SequenceLength")
def sequence_length(n: Node, seq: list[Any]) -> np.ndarray:
  return np.array(len(seq), dtype=np.int64)


def _position(n: Node, pos: Any, length: int) -> int:
  p = int(scalar(n, pos, "position"))
  return p + length if p < 0 else p


@op("SequenceAt")
def sequence_at(n: Node, seq: list[Any], pos: Any) -> Any:
  return seq[_position(n, pos, len(seq))]


@op("SequenceInsert")
def sequence_insert(n: Node, seq: list[Any], x: Any, pos: Any = None) -> list[Any]:
  out = list(seq)
  if pos is None: out.append(x)
  else: out.insert(_position(n, pos, len(seq)), x)
  return out


@op("SequenceErase")
def sequence_erase(n: Node, seq: list[Any], pos: Any = None) -> list[Any]:
  out = list(seq)
  del out[_position(n, pos, len(seq)) if pos is not None else -1]
  return out


@op("ConcatFromSequence")
def concat_from_sequence(n: Node, seq: list[Any]) -> Tensor:
  ts = [tensor(n, x) for x in seq]
  axis = n.attr("axis")
  if n.attr("new_axis", 0): return Tensor.stack(*ts, dim=axis_of(axis, ts[0].ndim + 1))
  return Tensor.cat(*ts, dim=axis_of(axis, ts[0].ndim))


@op("SplitToSequence")
def split_to_sequence(n: Node, x: Any, split: Any = None) -> list[Any]:
  t = tensor(n, x)
  axis = axis_of(n.attr("axis", 0), t.ndim)
  if split is None:
    parts = list(t.split(1, axis))
    return [p.squeeze(axis) for p in parts] if not n.attr("keepdims", 1) else parts
  sizes = value_of(n, split, "split").reshape(-1).tolist()
  if len(sizes) == 1: return list(t.split(int(sizes[0]), axis))
  return list(t.split([int(s) for s in sizes], axis))


@op("SequenceMap")
def sequence_map(n: Node, seq: list[Any], *others: Any) -> tuple[list[Any], ...]:
  body = n.attr("body")
  names = [i.name for i in body.input]
  results: list[list[Any]] = [[] for _ in body.output]
  for i in range(len(seq)):
    args = [seq[i]] + [o[i] if isinstance(o, list) else o for o in others]
    for j, v in enumerate(_run(n, body, dict(zip(names, args)))): results[j].append(v)
  return tuple(results)


# ---- optionals: None or the value ----

@op("Optional")
def optional(n: Node, x: Any = None) -> Any: return x


@op("OptionalHasElement")
def optional_has_element(n: Node, x: Any = None) -> np.ndarray:
  return np.array(x is not None)


@op("OptionalGetElement")
def optional_get_element(n: Node, x: Any) -> Any:
  if x is None: raise n.error("the optional is empty")
  return x
