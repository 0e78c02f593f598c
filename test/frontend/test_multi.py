"""Multi-device tensors: shard, replication, ops on tuple devices, collectives and gradients.

Every value is checked against numpy, and where it matters, the part each device holds is read
from that device's own buffer (the shards of the tuple-device BUFFER)."""
import numpy as np
import pytest

from unigrad import Tensor, dtypes, multi, nn
from unigrad.dtype import to_numpy_name
from unigrad.engine import buffer_of
from unigrad.nn import optim
from unigrad.runtime.ops_cpu import find_c_compiler
from unigrad.schedule.sharding import MultiDeviceError, multi_view, shards
from unigrad.uop import Ops, UOp

RNG = np.random.default_rng(0)
A = RNG.standard_normal((4, 6)).astype(np.float32)
W = RNG.standard_normal((6, 3)).astype(np.float32)


@pytest.fixture
def devs(device):
  """Two devices of the kind under test, named the way users write them."""
  return (f"{device}:0", f"{device}:1")


def canon(devices):
  return tuple(d[:-2] if d.endswith(":0") else d for d in devices)


def parts(t: Tensor) -> list[np.ndarray]:
  """What each device holds, read from its own buffer (a freshly realized tensor)."""
  t.realize()
  base = t.uop
  while base.op is not Ops.BUFFER: base = base.src[0]
  axis, n = t.uop.axis, len(t.device)
  assert t.uop is multi_view(base, t.shape, axis), "not laid out as realize lays it out"
  local = list(t.shape)
  if axis is not None: local[axis] //= n
  out = []
  for d, s in zip(t.device, shards[base]):
    assert s.arg.device == d and buffer_of(s).device == d
    raw = buffer_of(s).copyout()
    out.append(np.frombuffer(raw, dtype=to_numpy_name(t.dtype)).reshape(local))
  return out


def mk(a: np.ndarray, devs: tuple) -> Tensor:
  """`a` on the first of `devs`."""
  return Tensor(a, device=devs[0])


def close(t: Tensor, ref: np.ndarray, atol: float = 1e-5) -> None:
  got = t.numpy()
  assert got.shape == ref.shape, (got.shape, ref.shape)
  np.testing.assert_allclose(got, ref, atol=atol, rtol=1e-5)


# ---- shard and replicate ----

def test_shard_puts_one_chunk_on_each_device(devs):
  x = mk(A, devs).shard(devs)
  assert x.device == canon(devs) and x.uop.axis == 0 and x.shape == (4, 6)
  p = parts(x)
  np.testing.assert_array_equal(p[0], A[:2])
  np.testing.assert_array_equal(p[1], A[2:])
  close(x, A)


def test_shard_along_a_negative_axis(devs):
  x = mk(A, devs).shard(devs, axis=-1)
  assert x.uop.axis == 1
  p = parts(x)
  np.testing.assert_array_equal(p[0], A[:, :3])
  np.testing.assert_array_equal(p[1], A[:, 3:])
  assert x.tolist() == A.tolist()


def test_shard_in_place_and_reshard(devs):
  x = mk(A, devs)
  assert x.shard_(devs, 1) is x and x.device == canon(devs) and x.uop.axis == 1
  y = x.shard(devs, 0)
  assert y.uop.axis == 0
  np.testing.assert_array_equal(parts(y)[1], A[2:])
  assert x.shard(devs, 1) is x  # already split that way


def test_three_devices(device):
  d3 = tuple(f"{device}:{i}" for i in range(3))
  a = RNG.standard_normal((9, 3)).astype(np.float32)
  x = Tensor(a, device=device).shard(d3)
  assert [p.shape for p in parts(x)] == [(3, 3)] * 3
  close(x.sum(0), a.sum(0))
  close((x * 2).max(1), (a * 2).max(1))
  close(multi.reduce(x), a.reshape(3, 3, 3).sum(0))
  ar = multi.allreduce(x)
  for p in parts(ar): np.testing.assert_allclose(p, a.reshape(3, 3, 3).sum(0), atol=1e-5)
  d2 = d3[:2]
  x2 = Tensor(a[:6], device=device).shard(d2, 0)
  y = x2.shard(d3[::-1])  # from 2 devices to 3 others, in another order
  assert y.device == canon(d3[::-1]) and y.uop.axis == 0
  np.testing.assert_array_equal(parts(y)[2], a[4:6])


def test_to_a_tuple_replicates(devs):
  x = mk(A, devs).to(devs)
  assert x.device == canon(devs) and x.uop.axis is None
  for p in parts(x): np.testing.assert_array_equal(p, A)
  assert x.to(devs) is x


def test_to_one_device_gathers(devs):
  x = mk(A, devs).shard(devs, 1)
  y = x.to(devs[0])
  assert y.device == canon(devs)[0] and not isinstance(y.device, tuple)
  close(y, A)
  close(x.realize().to(devs[1]) + 1, A + 1)


def test_constructors_take_a_tuple_of_devices(devs):
  t = Tensor([[1.0, 2.0], [3.0, 4.0]], device=devs)
  assert t.device == canon(devs) and t.uop.axis is None
  assert t.tolist() == [[1.0, 2.0], [3.0, 4.0]]
  z = Tensor.zeros(2, 3, device=devs)
  assert z.device == canon(devs) and z.tolist() == [[0.0] * 3] * 2
  r = Tensor.arange(6, device=devs)
  assert r.device == canon(devs) and r.tolist() == list(range(6))
  e = Tensor.empty(4, device=devs).assign(Tensor.ones(4, device=devs))
  for p in parts(e): np.testing.assert_array_equal(p, np.ones(4, np.float32))
  assert Tensor.full((2,), 7, device=devs, requires_grad=None).tolist() == [7, 7]


# ---- ops on tuple devices ----

def test_elementwise_between_and_across_splits(devs):
  x0, x1 = mk(A, devs).shard(devs, 0), mk(A, devs).shard(devs, 1)
  r = mk(A, devs).to(devs)
  s = x0 * 2 + 1
  assert s.uop.axis == 0
  close(s, A * 2 + 1)
  close(x0 + x1, 2 * A)  # resharded all-to-all
  close(x1 * r - x0, A * A - A)
  close((x0 > 0).where(x0, x1 * 3), np.where(A > 0, A, 3 * A))
  assert x0.int().dtype == dtypes.int32
  close(x0.int(), A.astype(np.int32))
  close(x0 + mk(A[0], devs).to(devs), A + A[0])  # a replicated row broadcasts


def test_reductions_over_every_axis(devs):
  x0, x1 = mk(A, devs).shard(devs, 0), mk(A, devs).shard(devs, 1)
  s = x0.sum(0)  # over the shard axis: combined across the devices, then replicated
  assert s.uop.axis is None and s.device == canon(devs)
  p = parts(s)
  np.testing.assert_array_equal(p[0], p[1])
  np.testing.assert_allclose(p[0], A.sum(0), atol=1e-5)
  assert x0.sum(1).uop.axis == 0
  close(x0.sum(1), A.sum(1))
  close(x1.sum(0), A.sum(0))
  close(x1.sum(), A.sum())
  close(x0.max(0), A.max(0))
  close(x1.max(1, keepdim=True), A.max(1, keepdims=True))
  close(x0.mean(), A.mean())
  close((-x0).prod(0), (-A).prod(0), atol=1e-4)
  close(x0.softmax(0), np.exp(A) / np.exp(A).sum(0, keepdims=True))
  ints = (A * 10).astype(np.int32)
  xi = mk(ints, devs).shard(devs, 0)
  assert xi.sum(0).tolist() == ints.sum(0).tolist() and xi.sum(0).dtype == dtypes.int64
  assert (xi > 5).any(0).tolist() == (ints > 5).any(0).tolist()
  assert xi.min().item() == ints.min()


@pytest.mark.parametrize("shape,axis", [((2, 2, 6), 0), ((24,), 0), ((1, 24), 1), ((8, 3), 0)])
def test_reshape_remaps_the_shard_axis(devs, shape, axis):
  y = mk(A, devs).shard(devs).reshape(shape)
  assert y.uop.axis == axis
  close(y, A.reshape(shape))


def test_reshape_and_permute_of_an_inner_split(devs):
  x1 = mk(A, devs).shard(devs, 1)
  assert x1.reshape(4, 2, 3).uop.axis == 1
  close(x1.reshape(4, 2, 3), A.reshape(4, 2, 3))
  t = x1.permute(1, 0)
  assert t.uop.axis == 0
  close(t, A.T)
  np.testing.assert_array_equal(parts(t)[1], A.T[3:])


def test_views_off_and_on_the_shard_axis(devs):
  x0 = mk(A, devs).shard(devs, 0)
  close(x0[:, 1:5], A[:, 1:5])
  close(x0[0:2], A[0:2])
  close(x0.flip(0), A[::-1])
  close(x0.flip(1), A[:, ::-1])
  close(x0.pad(((0, 0), (1, 2))), np.pad(A, ((0, 0), (1, 2))))
  close(x0.pad(((2, 2), (0, 0))), np.pad(A, ((2, 2), (0, 0))))
  close(x0.reshape(4, 6, 1).expand(4, 6, 2), np.broadcast_to(A[..., None], (4, 6, 2)))
  close(x0.cat(x0, dim=1), np.concatenate([A, A], 1))


def test_matmul_data_and_tensor_parallel(devs):
  x = mk(A, devs).shard(devs, 0)
  out = x @ mk(W, devs).to(devs)  # data parallel: batch split, weight replicated
  assert out.device == canon(devs) and out.uop.axis == 0
  close(out, A @ W, atol=1e-4)
  close(out.to(devs[1]), A @ W, atol=1e-4)
  r = mk(A, devs).to(devs)
  w4 = RNG.standard_normal((6, 4)).astype(np.float32)
  cols = r @ mk(w4.T.copy(), devs).shard(devs, 0).T  # weight columns split: output columns split
  rows = r @ mk(w4, devs).shard(devs, 0)  # weight rows split: partial products allreduced
  assert cols.uop.axis == 1 and rows.uop.axis is None
  close(cols, A @ w4, atol=1e-4)
  close(rows, A @ w4, atol=1e-4)


def test_contiguous_and_realize_keep_the_split(devs):
  x = mk(A, devs).shard(devs, 1)
  y = (x + 1).contiguous()
  z = y * 2
  z.realize()
  assert y.uop.op is not Ops.CONTIGUOUS  # realized along with z
  np.testing.assert_allclose(parts(z)[1], (A[:, 3:] + 1) * 2)
  before = z.uop
  assert z.realize().uop is before  # already realized: nothing runs


def test_schedule_runs_kernels_on_each_device_and_copies_between(devs):
  lin = mk(A, devs).shard(devs, 0).sum().schedule()
  devices = {p.arg.device for c in lin.src if c.src[0].op is not Ops.COPY for p in c.src[1:]}
  assert devices == set(canon(devs))
  assert any(c.src[0].op is Ops.COPY for c in lin.src)


def test_assign_to_sharded_and_replicated(devs):
  y = mk(A, devs).shard(devs, 0).realize()
  y.assign(y * 2)
  close(y, A * 2)
  np.testing.assert_array_equal(parts(y)[0], A[:2] * 2)
  z = mk(A, devs).to(devs).realize()
  z.assign(mk(A, devs).shard(devs, 1) + 1)  # stored into every replica
  assert z.uop.axis is None
  for p in parts(z): np.testing.assert_allclose(p, A + 1)


def test_mixed_device_kinds():
  if find_c_compiler() is None: pytest.skip("no C compiler")
  x = Tensor(A, device="PYTHON").shard(("CPU", "PYTHON"), 1)
  close((x * x).sum(1), (A * A).sum(1))
  close(x.T @ Tensor(A).to(("CPU", "PYTHON")), A.T @ A, atol=1e-4)


# ---- collectives ----

V = np.arange(8, dtype=np.float32) * 1.5 - 3


def test_broadcast_and_scatter(devs):
  b = multi.broadcast(mk(V, devs), devs)
  assert b.device == canon(devs) and b.uop.axis is None and b.shape == (8,)
  for p in parts(b): np.testing.assert_array_equal(p, V)
  s = multi.scatter(mk(V, devs), devs)
  assert s.uop.axis == 0 and s.shape == (8,)
  np.testing.assert_array_equal(parts(s)[1], V[4:])


def test_gather_and_reduce(devs):
  s = multi.scatter(mk(V, devs), devs)
  g = multi.gather(s)
  assert g.device == canon(devs)[0] and g.tolist() == V.tolist()
  r = multi.reduce(s)
  assert r.device == canon(devs)[0]
  close(r, V[:4] + V[4:])
  m = multi.reduce(mk(A, devs).shard(devs, 0))  # 2-d: the parts (2, 6) summed
  close(m, A[:2] + A[2:])


def test_allgather_reduce_scatter_allreduce(devs):
  s = multi.scatter(mk(V, devs), devs)
  ag = multi.allgather(s)
  assert ag.uop.axis is None
  for p in parts(ag): np.testing.assert_array_equal(p, V)
  rs = multi.reduce_scatter(s)
  assert rs.uop.axis == 0 and rs.shape == (4,)
  p = parts(rs)
  np.testing.assert_allclose(p[0], (V[:4] + V[4:])[:2])
  np.testing.assert_allclose(p[1], (V[:4] + V[4:])[2:])
  ar = multi.allreduce(s)
  assert ar.uop.axis is None and ar.shape == (4,)
  for p in parts(ar): np.testing.assert_allclose(p, V[:4] + V[4:])
  x = mk(A.reshape(8, 3), devs).shard(devs, 0)
  close(multi.allreduce(x), A.reshape(8, 3)[:4] + A.reshape(8, 3)[4:])
  close(multi.allgather(mk(A, devs).shard(devs, 1)), A)


def test_collectives_are_built_from_copy_and_replicated(devs):
  b = multi.broadcast(mk(V, devs), devs).uop
  ops = {u.op for u in b.toposort()}
  assert Ops.COPY in ops and Ops.REPLICATED in ops
  rs = multi.reduce_scatter(multi.scatter(mk(V, devs), devs)).uop
  assert {Ops.COPY, Ops.PERMUTE, Ops.REDUCE} <= {u.op for u in rs.toposort()}


# ---- gradients ----

def test_gradient_through_shard(devs):
  x = Tensor(A, device=devs[0], requires_grad=True)
  xs = x.shard(devs, 1)
  ((xs * xs).sum() + (xs * 3).exp().sum()).backward()
  assert x.grad.device == canon(devs)[0]
  close(x.grad, 2 * A + 3 * np.exp(3 * A), atol=1e-3)


def test_gradient_of_data_parallel_matmul(devs):
  x = Tensor(A, device=devs[0], requires_grad=True)
  w = Tensor(W, device=devs[1], requires_grad=True).to_(devs)  # a replicated leaf
  b = Tensor([0.5, -1.0, 2.0], device=devs, requires_grad=True)
  out = x.shard(devs, 0) @ w + b
  loss = (out * out).mean()
  loss.backward()
  g = 2 * (A @ W + [0.5, -1.0, 2.0]) / out.numel()
  assert w.grad.device == canon(devs) and w.grad.uop.axis is None
  close(w.grad, A.T @ g, atol=1e-5)
  close(b.grad, g.sum(0), atol=1e-5)
  close(x.grad, g @ W.T, atol=1e-5)
  close(loss, (g * g).sum() * out.numel() / 4, atol=1e-4)


def test_gradient_of_a_single_device_weight_replicated_in_the_loss(devs):
  w = Tensor(W, device=devs[0], requires_grad=True)  # replicated inside the loss (REPLICATED)
  loss = (Tensor(A, device=devs[0]).shard(devs, 0) @ w.to(devs)).sum()
  loss.backward()
  assert w.grad.device == canon(devs)[0]
  close(w.grad, A.T @ np.ones((A.shape[0], W.shape[1]), np.float32), atol=1e-5)


def test_data_parallel_training_matches_one_device(devs):
  x_np, y_np = RNG.standard_normal((8, 5)).astype(np.float32), RNG.standard_normal((8, 2))
  init = [RNG.standard_normal(s).astype(np.float32) for s in ((4, 5), (4,), (2, 4), (2,))]

  def train(split: bool) -> list[np.ndarray]:
    l1, l2 = nn.Linear(5, 4), nn.Linear(4, 2)
    params = [l1.weight, l1.bias, l2.weight, l2.bias]
    for p, v in zip(params, init): p.assign(Tensor(v)).realize()
    if split:
      for p in params: p.to_(devs)
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    x, y = Tensor(x_np), Tensor(y_np.astype(np.float32))
    if split: x, y = x.shard(devs), y.shard(devs)
    with Tensor.train():
      for _ in range(2):
        opt.zero_grad()
        (l2(l1(x).relu()) - y).square().mean().backward()
        opt.step()
    if split: assert params[0].device == canon(devs)
    return [p.numpy() for p in params]

  for got, want in zip(train(True), train(False)): np.testing.assert_allclose(got, want, atol=1e-5)


# ---- the axis property ----

def test_axis_of_spec_rows(devs):
  d = canon(devs)
  x = mk(A, devs).shard(devs)
  assert UOp(Ops.COPY, x.dtype, (mk(A, devs).uop,), d).axis == 0  # COPY to n devices
  assert x.uop.axis == 0 and x.sum(0).uop.axis is None and x.sum(1).uop.axis == 0
  e = mk(A, devs).reshape(1, 4, 6).expand(2, 4, 6).copy(d)
  rep = UOp(Ops.REPLICATED, e.dtype, (e.uop,), (0,))
  assert rep.shape == (1, 4, 6) and rep.axis is None  # collapsed to 1, replicated
  assert x.permute(1, 0).uop.axis == 1 and (x + 1).uop.axis == 0
  assert x.to(devs[1]).uop.axis is None


# ---- bad input ----

def test_mixing_a_tuple_device_with_one_device_names_both(devs):
  x = mk(A, devs).shard(devs)
  with pytest.raises(RuntimeError, match="one device") as err: x + Tensor(A, device=devs[1])
  assert str(canon(devs)) in str(err.value) and str(err.value).endswith(canon(devs)[1])
  with pytest.raises(RuntimeError, match="one device") as err: Tensor(A, device=devs[0]) * x
  assert str(canon(devs)) in str(err.value)
  other = (devs[0], devs[1].split(":")[0] + ":2")
  with pytest.raises(RuntimeError, match="one device"): x + mk(A, devs).shard(other)


def test_bad_shard_arguments(devs, no_kernels):
  t = mk(A, devs)
  with pytest.raises(IndexError, match="out of range"): t.shard(devs, 2)
  with pytest.raises(ValueError, match="does not split evenly"): mk(A[:3], devs).shard(devs)
  with pytest.raises(ValueError, match="0-d"): Tensor(1.0).shard(devs)
  with pytest.raises(ValueError, match="empty"): t.shard(())
  with pytest.raises(ValueError, match="distinct"): t.shard((devs[0], devs[0]))
  with pytest.raises(TypeError, match="tuple of device names"): t.shard(devs[0])
  with pytest.raises(RuntimeError, match="NOPE"): t.shard(("NOPE", devs[0]))
  with pytest.raises(RuntimeError, match="NOPE"): t.to(("NOPE:1",))


def test_bad_collective_and_primitive_arguments(devs, no_kernels):
  with pytest.raises(ValueError, match="tuple of devices"): multi.gather(mk(V, devs))
  with pytest.raises(ValueError, match="split along axis 0"):
    multi.reduce(mk(A, devs).shard(devs, 1))
  with pytest.raises(ValueError, match="split evenly"):
    multi.reduce_scatter(mk(A[:2], devs).shard(devs))
  with pytest.raises(ValueError, match="evenly"): mk(A[:3], devs).copy(canon(devs))
  with pytest.raises(ValueError, match="shard axis"): mk(A, devs).shard(devs).replicated(1)
  with pytest.raises(ValueError, match="tuple of devices"): mk(A, devs).replicated(0)


def test_ops_that_would_split_the_shard_axis_unevenly_raise(devs, no_kernels):
  x = mk(A, devs).shard(devs)
  with pytest.raises(MultiDeviceError, match="shard"): x.reshape(3, 8).realize()
  with pytest.raises(MultiDeviceError, match="gather it"): x[1].realize()
  with pytest.raises(MultiDeviceError, match="gather it"): x[1:4].numpy()
