"""Recurrent layers: LSTM, GRU and RNN, every direction, optional input and activation.

The input projection X @ W^T is one matmul over all steps; the recurrence is unrolled over the
sequence (its length is static). With sequence_lens, a batch entry's state stops at its length
and its later outputs are zero; the reverse direction runs each entry's valid prefix backwards."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unigrad.onnx.ops.registry import Node, Tensor, dtypes, op, tensor

Act = Callable[[Tensor], Tensor]


def _activation(name: str, alpha: float | None, beta: float | None) -> Act:
  a, b = alpha, beta
  table: dict[str, Act] = {
    "relu": Tensor.relu, "tanh": Tensor.tanh, "sigmoid": Tensor.sigmoid,
    "softsign": Tensor.softsign, "softplus": lambda x: (x.exp() + 1).log(),
    "affine": lambda x: x * (a if a is not None else 1.0) + (b or 0.0),
    "leakyrelu": lambda x: x.leaky_relu(a if a is not None else 0.01),
    "thresholdedrelu": lambda x: (x > (a if a is not None else 1.0)).where(x, 0),
    "scaledtanh": lambda x: (x * (b if b is not None else 1.0)).tanh() * (a if a is not None
                                                                          else 1.0),
    "hardsigmoid": lambda x: (x * (a if a is not None else 0.2) + (b if b is not None
                                                                    else 0.5)).clamp(0, 1),
    "elu": lambda x: (x > 0).where(x, (x.exp() - 1) * (a if a is not None else 1.0)),
  }
  fn = table.get(name.lower())
  if fn is None: raise ValueError(f"activation {name!r} is not supported")
  return fn


_NEEDS_ALPHA = {"affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"}
_NEEDS_BETA = {"affine", "scaledtanh", "hardsigmoid"}


def _activations(n: Node, defaults: list[str], dirs: int) -> list[list[Act]]:
  names = n.attr("activations", None) or defaults * dirs
  alphas, betas = list(n.attr("activation_alpha", [])), list(n.attr("activation_beta", []))
  acts = []
  for name in names:
    al = alphas.pop(0) if name.lower() in _NEEDS_ALPHA and alphas else None
    be = betas.pop(0) if name.lower() in _NEEDS_BETA and betas else None
    acts.append(_activation(name, al, be))
  k = len(defaults)
  return [acts[d * k:(d + 1) * k] for d in range(dirs)]


def _setup(n: Node, x: Any, gates: int, xs: tuple[Any, ...]) -> dict[str, Any]:
  t = tensor(n, x)
  if n.attr("layout", 0): t = t.permute(1, 0, 2)
  w, r = tensor(n, xs[0]), tensor(n, xs[1])
  dirs = 2 if n.attr("direction", "forward") == "bidirectional" else 1
  hidden = n.attr("hidden_size", None) or r.shape[-1]
  steps, batch = t.shape[0], t.shape[1]
  b = tensor(n, xs[2]) if len(xs) > 2 and xs[2] is not None else None
  lens = tensor(n, xs[3]).cast(dtypes.int64) if len(xs) > 3 and xs[3] is not None else None
  h0 = tensor(n, xs[4]) if len(xs) > 4 and xs[4] is not None else None
  if h0 is not None and n.attr("layout", 0): h0 = h0.permute(1, 0, 2)
  return {"x": t, "w": w, "r": r, "b": b, "lens": lens, "h0": h0, "dirs": dirs,
          "hidden": hidden, "steps": steps, "batch": batch, "gates": gates}


def _zeros(s: dict[str, Any]) -> Tensor:
  x = s["x"]
  return Tensor.zeros(s["batch"], s["hidden"], dtype=x.dtype, device=x.device)


def _step_order(n: Node, s: dict[str, Any], d: int) -> list[int]:
  rev = n.attr("direction", "forward") == "reverse" or d == 1
  return list(range(s["steps"]))[::-1] if rev else list(range(s["steps"]))


def _finish(n: Node, s: dict[str, Any], ys: list[list[Tensor]], last: list[Tensor],
            extra: list[Tensor] | None = None) -> tuple[Tensor, ...]:
  y = Tensor.stack(*[Tensor.stack(*yd) for yd in ys], dim=1)  # (steps, dirs, batch, hidden)
  yh = Tensor.stack(*last)
  yc = Tensor.stack(*extra) if extra is not None else None
  if n.attr("layout", 0):
    y, yh = y.permute(2, 0, 1, 3), yh.permute(1, 0, 2)
    yc = yc.permute(1, 0, 2) if yc is not None else None
  return (y, yh) if yc is None else (y, yh, yc)


def _clip(n: Node, g: Tensor) -> Tensor:
  c = n.attr("clip", None)
  return g.clamp(-c, c) if c is not None else g


def _masked(s: dict[str, Any], step: int, new: Tensor, old: Tensor) -> tuple[Tensor, Tensor]:
  """(state, output) of a step under sequence_lens."""
  if s["lens"] is None: return new, new
  valid = (s["lens"] > step).reshape(-1, 1)
  return valid.where(new, old), valid.where(new, 0)


def _projections(s: dict[str, Any], d: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
  """X @ W^T for every step (steps, batch, gates*hidden), R^T, and the two biases."""
  x, w, r, b = s["x"], s["w"][d], s["r"][d], s["b"]
  gh = s["gates"] * s["hidden"]
  xw = x @ w.T
  wb = b[d][:gh] if b is not None else None
  rb = b[d][gh:] if b is not None else None
  return xw, r.T, wb, rb


@op("RNN")
def rnn(n: Node, x: Any, *xs: Any) -> tuple[Tensor, ...]:
  s = _setup(n, x, 1, xs)
  acts = _activations(n, ["Tanh"], s["dirs"])
  ys, last = [], []
  for d in range(s["dirs"]):
    xw, rt, wb, rb = _projections(s, d)
    if wb is not None: xw = xw + wb + rb
    h = s["h0"][d] if s["h0"] is not None else _zeros(s)
    out: list[Tensor] = [None] * s["steps"]  # type: ignore[list-item]
    for t in _step_order(n, s, d):
      new = acts[d][0](_clip(n, xw[t] + h @ rt))
      h, out[t] = _masked(s, t, new, h)
    ys.append(out)
    last.append(h)
  return _finish(n, s, ys, last)


@op("GRU")
def gru(n: Node, x: Any, *xs: Any) -> tuple[Tensor, ...]:
  s = _setup(n, x, 3, xs)
  acts = _activations(n, ["Sigmoid", "Tanh"], s["dirs"])
  hid, lbr = s["hidden"], n.attr("linear_before_reset", 0)
  ys, last = [], []
  for d in range(s["dirs"]):
    xw, rt, wb, rb = _projections(s, d)
    if wb is not None: xw = xw + wb
    f, g = acts[d]
    h = s["h0"][d] if s["h0"] is not None else _zeros(s)
    out: list[Tensor] = [None] * s["steps"]  # type: ignore[list-item]
    for t in _step_order(n, s, d):
      hr = h @ rt
      if rb is not None: hr = hr + rb
      z = f(_clip(n, xw[t][:, :hid] + hr[:, :hid]))
      r = f(_clip(n, xw[t][:, hid:2 * hid] + hr[:, hid:2 * hid]))
      if lbr: cand = xw[t][:, 2 * hid:] + r * hr[:, 2 * hid:]
      else:
        rh = (r * h) @ rt[:, 2 * hid:]
        cand = xw[t][:, 2 * hid:] + rh + (rb[2 * hid:] if rb is not None else 0)
      hh = g(_clip(n, cand))
      new = (1 - z) * hh + z * h
      h, out[t] = _masked(s, t, new, h)
    ys.append(out)
    last.append(h)
  return _finish(n, s, ys, last)


@op("LSTM")
def lstm(n: Node, x: Any, *xs: Any) -> tuple[Tensor, ...]:
  s = _setup(n, x, 4, xs)
  acts = _activations(n, ["Sigmoid", "Tanh", "Tanh"], s["dirs"])
  hid = s["hidden"]
  c0 = tensor(n, xs[5]) if len(xs) > 5 and xs[5] is not None else None
  if c0 is not None and n.attr("layout", 0): c0 = c0.permute(1, 0, 2)
  p = tensor(n, xs[6]) if len(xs) > 6 and xs[6] is not None else None
  ys, last, cells = [], [], []
  for d in range(s["dirs"]):
    xw, rt, wb, rb = _projections(s, d)
    if wb is not None: xw = xw + (wb + rb)
    f, g, hact = acts[d]
    h = s["h0"][d] if s["h0"] is not None else _zeros(s)
    c = c0[d] if c0 is not None else _zeros(s)
    pi, po, pf = (p[d][:hid], p[d][hid:2 * hid], p[d][2 * hid:]) if p is not None else \
      (None, None, None)
    out: list[Tensor] = [None] * s["steps"]  # type: ignore[list-item]
    for t in _step_order(n, s, d):
      gates = xw[t] + h @ rt
      gi, go, gf, gc = (gates[:, k * hid:(k + 1) * hid] for k in range(4))
      i = f(_clip(n, gi + pi * c if pi is not None else gi))
      fg = 1 - i if n.attr("input_forget", 0) else \
        f(_clip(n, gf + pf * c if pf is not None else gf))
      cnew = fg * c + i * g(_clip(n, gc))
      o = f(_clip(n, go + po * cnew if po is not None else go))
      hnew = o * hact(cnew)
      if s["lens"] is not None:
        valid = (s["lens"] > t).reshape(-1, 1)
        c = valid.where(cnew, c)
      else: c = cnew
      h, out[t] = _masked(s, t, hnew, h)
    ys.append(out)
    last.append(h)
    cells.append(c)
  return _finish(n, s, ys, last, cells)
