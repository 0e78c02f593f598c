"""A stack of post-LN transformer encoder blocks (BERT / all-MiniLM-L6-v2 shapes by default):
kernels per layer, the widest kernel, first call (schedule + codegen + compile) and the steady
forward time against PyTorch eager, measured in one run.

  python bench/transformer.py [--layers 2] [--dim 384] [--heads 12] [--ff 1536] [--batch 8]
                              [--seq 32]

Kernels per layer and buffers per kernel must not grow with depth (the fusion policy in
schedule/fusion.py). First-call times depend on the on-disk compile cache: point CACHEDIR at an
empty directory for a cold start.
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
from common import best_of, row, try_torch

from unigrad import Tensor, nn


class Block:
  """Attention (q/k/v/o Linear), residual + LayerNorm, GELU MLP, residual + LayerNorm."""

  def __init__(self, dim: int, heads: int, ff: int) -> None:
    self.heads = heads
    self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
    self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
    self.up, self.down = nn.Linear(dim, ff), nn.Linear(ff, dim)

  def params(self) -> list[Tensor]:
    layers = (self.q, self.k, self.v, self.o, self.ln1, self.ln2, self.up, self.down)
    return [p for m in layers for p in (m.weight, m.bias)]

  def __call__(self, x: Tensor) -> Tensor:
    b, t, d = x.shape
    q, k, v = (lin(x).reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
               for lin in (self.q, self.k, self.v))
    att = (q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)).softmax(-1) @ v
    x = self.ln1(x + self.o(att.transpose(1, 2).reshape(b, t, d)))
    return self.ln2(x + self.down(self.up(x).gelu(approximate="none")))


def torch_forward(torch, blocks: list[Block], x):  # noqa: ANN001 (torch is optional)
  F = torch.nn.functional
  def t(p: Tensor): return torch.from_numpy(p.numpy())  # noqa: ANN202
  for blk in blocks:
    b, s, d = x.shape
    q, k, v = (F.linear(x, t(m.weight), t(m.bias)).reshape(b, s, blk.heads, -1).transpose(1, 2)
               for m in (blk.q, blk.k, blk.v))
    att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
    x = F.layer_norm(x + F.linear(att, t(blk.o.weight), t(blk.o.bias)), (d,),
                     t(blk.ln1.weight), t(blk.ln1.bias))
    h = F.gelu(F.linear(x, t(blk.up.weight), t(blk.up.bias)))
    x = F.layer_norm(x + F.linear(h, t(blk.down.weight), t(blk.down.bias)), (d,),
                     t(blk.ln2.weight), t(blk.ln2.bias))
  return x


def main() -> None:
  p = argparse.ArgumentParser()
  for name, default in (("layers", 2), ("dim", 384), ("heads", 12), ("ff", 1536), ("batch", 8),
                        ("seq", 32), ("repeat", 5)):
    p.add_argument(f"--{name}", type=int, default=default)
  args = p.parse_args()
  blocks = [Block(args.dim, args.heads, args.ff) for _ in range(args.layers)]
  Tensor.realize(*[q for blk in blocks for q in blk.params()])
  xs = np.random.default_rng(0).standard_normal((args.batch, args.seq, args.dim), np.float32)
  x = Tensor(xs).realize()

  def forward() -> Tensor:
    y = x
    for blk in blocks: y = blk(y)
    return y

  for depth in range(1, args.layers + 1):
    y = x
    for blk in blocks[:depth]: y = blk(y)
    calls = y.schedule().src
    print(f"{depth} layer(s): {len(calls)} kernels, buffers per kernel "
          f"max {max(len(c.src) - 1 for c in calls)}, total {sum(len(c.src) - 1 for c in calls)}")
  t0 = time.perf_counter()
  out = forward().numpy()
  print(f"first call (schedule, codegen, compile, run): {time.perf_counter() - t0:.2f} s")
  torch = try_torch()
  theirs = {}
  if torch is not None:
    ref = torch_forward(torch, blocks, torch.from_numpy(xs))
    print(f"max |unigrad - torch| = {np.abs(out - ref.numpy()).max():.2e}")
    with torch.no_grad():
      theirs["torch"] = best_of(lambda: torch_forward(torch, blocks, torch.from_numpy(xs)),
                                args.repeat)
  row(f"forward {args.layers} layers", best_of(lambda: forward().realize(), args.repeat), theirs)


if __name__ == "__main__":
  main()
