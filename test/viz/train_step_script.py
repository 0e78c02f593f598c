"""A small training step (linear layer, SGD) traced by the viewer tests; `--fail` raises after
the first step (the viewer must still show what was traced, and the error)."""
import sys

from unigrad import Tensor, nn

Tensor.manual_seed(0)
layer = nn.Linear(8, 4)
opt = nn.optim.SGD(nn.state.get_parameters(layer), lr=0.1)
x, y = Tensor.randn(16, 8), Tensor.randn(16, 4)
with Tensor.train():
  opt.zero_grad()
  loss = ((layer(x) - y) ** 2).mean()
  loss.backward()
  opt.step()
print(f"loss {loss.item():.4f}")
if "--fail" in sys.argv: raise ValueError("the script failed on purpose")
