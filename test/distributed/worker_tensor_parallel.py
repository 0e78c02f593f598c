"""Run under `mpiexec -n 2`: a tensor-parallel MLP (column- then row-parallel Linear) takes the
same training step as the whole MLP in one process, and attention with its heads split over the
ranks gives the whole attention's output and gradients."""
import numpy as np

from unigrad import Tensor, nn
import unigrad.distributed as dist
from unigrad.distributed.tensor_parallel import (ColumnParallelLinear, ParallelAttention,
                                                 RowParallelLinear, shard)

TOL = 1e-5


def close(a: np.ndarray, b: np.ndarray, what: str) -> None:
  err = float(np.abs(a - b).max())
  assert err <= TOL, f"{what}: max error {err}"


def mlp_step() -> None:
  Tensor.manual_seed(3)
  l1, l2 = nn.Linear(8, 16), nn.Linear(16, 4)
  x = Tensor(np.random.default_rng(1).random((6, 8), dtype=np.float32))
  c1, r2 = ColumnParallelLinear.from_linear(l1), RowParallelLinear.from_linear(l2)
  for layers in ((l1, l2), (c1, r2)):
    loss = layers[1](layers[0](x).relu()).square().mean()
    opt = nn.optim.SGD([layers[0].weight, layers[0].bias, layers[1].weight, layers[1].bias], 0.1)
    opt.zero_grad()
    loss.backward()
    opt.step()
  close(shard(l1.weight, 0).numpy(), c1.weight.numpy(), "column-parallel weight after a step")
  close(shard(l1.bias, 0).numpy(), c1.bias.numpy(), "column-parallel bias after a step")
  close(shard(l2.weight, 1).numpy(), r2.weight.numpy(), "row-parallel weight after a step")
  close(l2.bias.numpy(), r2.bias.numpy(), "row-parallel bias after a step")
  gathered = ColumnParallelLinear.from_linear(l1, gather_output=True)(x)
  close(gathered.numpy(), l1(x).numpy(), "column-parallel gather_output")


def attention() -> None:
  Tensor.manual_seed(4)
  dim, heads = 8, 4
  ws = [nn.Linear(dim, dim) for _ in range(4)]
  x0 = np.random.default_rng(2).random((2, 3, dim), dtype=np.float32)
  x = Tensor(x0, requires_grad=True)
  b, t = 2, 3
  q, k, v = (w(x).reshape(b, t, heads, dim // heads).transpose(1, 2) for w in ws[:3])
  o = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(b, t, dim)
  want = ws[3](o)
  want.sum().backward()
  xp = Tensor(x0, requires_grad=True)
  got = ParallelAttention.from_linears(*ws, n_heads=heads)(xp, is_causal=True)
  got.sum().backward()
  close(got.numpy(), want.numpy(), "parallel attention output")
  close(xp.grad.numpy(), x.grad.numpy(), "parallel attention input gradient")


def main() -> None:
  dist.init()
  mlp_step()
  attention()
  print(f"rank {dist.rank()} ok")


if __name__ == "__main__":
  main()
