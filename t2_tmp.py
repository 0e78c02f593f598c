import numpy as np, sys
from unigrad import Tensor, Variable
n = Variable('n', 1, 16)
X = np.random.rand(16, 4).astype(np.float32); W = np.random.rand(4, 5).astype(np.float32)
x = Tensor(X).realize(); w = Tensor(W).realize()
def chk(name, t, ref):
  try:
    got = t.numpy()
    ok = got.shape == ref.shape and np.allclose(got, ref, atol=1e-5)
    print(name, "OK" if ok else f"BAD {got} {ref}")
  except Exception as e:
    import traceback; print(name, "ERR", type(e).__name__, str(e)[:300]); traceback.print_exc(limit=-4)
for v in (3, 7):
  nb = n.bind(v)
  chk("shrink", x[:nb], X[:v])
  chk("elementwise", (x[:nb] * 2 + 1).exp(), np.exp(X[:v]*2+1))
  chk("sum0", (x[:nb] * 2).sum(axis=0), (X[:v]*2).sum(0))
  chk("sum1", x[:nb].sum(axis=1), X[:v].sum(1))
  chk("max0", x[:nb].max(axis=0), X[:v].max(0))
  chk("mean0", x[:nb].mean(axis=0), X[:v].mean(0))
  chk("matmul", x[:nb] @ w, X[:v] @ W)
  chk("reshape", x[:nb].reshape(nb, -1), X[:v])
  chk("reshape2", x[:nb].reshape(-1), X[:v].reshape(-1))
  chk("pad", x[:nb].pad(((0, nb), (0, 0))), np.pad(X[:v], ((0, v), (0, 0))))
  chk("pad1", x[:nb].pad(((1, 2), (0, 0)), value=3.0), np.pad(X[:v], ((1, 2), (0, 0)), constant_values=3))
  e = np.exp(X[:v].T - X[:v].T.max(1, keepdims=True)); chk("softmax", x[:nb].T.softmax(axis=1), e / e.sum(1, keepdims=True))
  chk("empty", (Tensor.empty(nb, 4) * 0 + 1), np.ones((v, 4), np.float32))
  chk("shrinkvar", x.shrink(((0, nb), None)), X[:v])
  chk("mul_n", x[:nb] * nb, X[:v] * v)
  chk("tolist", Tensor(x[:nb].tolist()), X[:v])
