"""Snapshots of rendered kernels: the C source of a set of kernels, each lowered with fixed opts
for a fixed vector target, against the digests recorded in snapshots.json.

A change to a codegen stage that must not change its output (a speed-up, a refactor) leaves every
digest as it is. A change meant to change the output regenerates the file with
`python test/codegen/test_snapshots.py` and says in its commit why the new code is right.
"""
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from unigrad import Tensor, dtypes
from unigrad.codegen.opt import Opt
from unigrad.codegen.pipeline import full_rewrite
from unigrad.knobs import Context
from unigrad.renderer.cstyle import CRenderer
from unigrad.uop import KernelInfo

SNAPSHOTS = Path(__file__).with_name("snapshots.json")
VEC = CRenderer("CPU", vector_bytes=64)  # fixed, not the host's: the same C on every machine


def x(*shape: int, dtype=dtypes.float32) -> Tensor: return Tensor.empty(*shape, dtype=dtype,
                                                                          device="NULL")


def _gelu() -> Tensor: return x(32, 64).gelu()
def _matmul() -> Tensor: return x(16, 64) @ x(64, 64)
def _sum() -> Tensor: return (x(8, 256) + 1).sum(1)
def _softmax() -> Tensor: return x(16, 64).softmax(1)
def _padded() -> Tensor: return x(5, 6).pad(((1, 2), (0, 3))).sum(0)
def _permuted() -> Tensor: return x(6, 10).reshape(4, 15).T * 2
def _mixed() -> Tensor: return x(4, 16) + x(4, 16, dtype=dtypes.int64).cast(dtypes.float32)
def _transcendental() -> Tensor: return (x(64).exp() + x(64).sin()).sqrt()


# name: (program, opts of its last kernel)
CASES: dict[str, tuple[Callable[[], Tensor], list[Opt]]] = {
  "gelu_upcast_thread": (_gelu, [Opt.thread(0, 2), Opt.upcast(1, 16)]),
  "matmul_register_tile": (_matmul, [Opt.upcast(1, 16), Opt.upcast(0, 4)]),
  "matmul_tile_unroll": (_matmul, [Opt.upcast(1, 8), Opt.upcast(0, 2), Opt.unroll(2, 4),
                                   Opt.thread(0, 2)]),
  "sum_group_reduce": (_sum, [Opt.upcast(0, 2), Opt.group(1, 16)]),
  "sum_wide_group": (_sum, [Opt.group(1, 32)]),
  "softmax_rows": (_softmax, [Opt.upcast(0, 4)]),
  "padded_gated": (_padded, [Opt.padto(0, 16), Opt.upcast(0, 16)]),
  "permuted_divmod": (_permuted, [Opt.upcast(1, 4), Opt.upcast(0, 3)]),
  "mixed_dtypes": (_mixed, [Opt.upcast(1, 16)]),
  "transcendental": (_transcendental, [Opt.upcast(0, 8)]),
  "matmul_unoptimized": (_matmul, []),
}


def render(name: str) -> str:
  """The C of case `name`, without the bounds checks the test suite turns on elsewhere."""
  program, opts = CASES[name]
  kernel = program().schedule().src[-1].src[0]
  with Context(CHECK_OOB=0, SPEC=1):
    linear = full_rewrite(kernel.replace(arg=KernelInfo(opts_to_apply=tuple(opts))), VEC)
    return VEC.render("k", linear)


def digest(src: str) -> str: return hashlib.sha256(src.encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_kernel_matches_its_snapshot(name: str) -> None:
  want = json.loads(SNAPSHOTS.read_text()).get(name)
  src = render(name)
  assert digest(src) == want, (
    f"the C of {name} changed; if that is intended, regenerate {SNAPSHOTS.name} with "
    f"`python test/codegen/test_snapshots.py` and say why in the commit. New source:\n{src}")


if __name__ == "__main__":
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
  SNAPSHOTS.write_text(json.dumps({n: digest(render(n)) for n in sorted(CASES)}, indent=2) + "\n")
  print(f"wrote {len(CASES)} digests to {SNAPSHOTS}")
