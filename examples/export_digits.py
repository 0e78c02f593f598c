"""Export the trained digits CNN as standalone C (no Python, no unigrad): digits_cnn.c and .h.

  python examples/train_digits.py        # trains, writes digits_cnn.safetensors
  python examples/export_digits.py       # writes digits_cnn.c / digits_cnn.h, prints how to build

The exported function (weights embedded as `static const` arrays):

  void digits_cnn(int batch, const float *in0, float *out0);

in0 holds `batch` digits of 64 pixels in [0, 1] (8x8, row-major), out0 receives `batch` x 10
logits. `--batch N` exports a fixed batch instead (`void digits_cnn(const float *in0, ...)`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from train_digits import DATA, DigitsCNN, load_digits, split  # noqa: E402

from unigrad import Tensor, dtypes  # noqa: E402
from unigrad.export import NumericalFunction, svmap  # noqa: E402
from unigrad.export.native import BUILD_FLAGS  # noqa: E402
from unigrad.nn.state import load_state_dict, safe_load  # noqa: E402


def export(weights: str, name: str = "digits_cnn",
           batch: int | None = None) -> tuple[NumericalFunction, DigitsCNN]:
  """The digits CNN with the saved weights, as a NumericalFunction (and the model)."""
  model = DigitsCNN()
  load_state_dict(model, safe_load(weights))
  if batch is not None:
    return NumericalFunction(model, ((batch, 64), dtypes.float32), name=name), model
  one = svmap(lambda x: model(x.reshape(1, 64)).reshape(10))  # the batch size is a C argument
  return NumericalFunction(one, ((1, 64), dtypes.float32), name=name), model


def main(argv: list[str] | None = None) -> NumericalFunction:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--weights", default="digits_cnn.safetensors")
  p.add_argument("--out-dir", default=".")
  p.add_argument("--name", default="digits_cnn")
  p.add_argument("--batch", type=int, default=None, help="a fixed batch size (default: runtime)")
  p.add_argument("--check", type=int, default=64,
                 help="compare the C with unigrad on the first N held-out test digits (0: skip)")
  args = p.parse_args(argv)
  if not Path(args.weights).exists():
    p.error(f"{args.weights} not found: run examples/train_digits.py first (it reads {DATA.name})")
  nf, model = export(args.weights, args.name, args.batch)
  out = Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / f"{args.name}.c").write_text(nf.source)
  (out / f"{args.name}.h").write_text(nf.header)
  print(f"wrote {out / args.name}.c ({len(nf.source) // 1024} KiB, "
        f"{len(nf.rendered_kernels)} kernels) and {out / args.name}.h")
  print(next(line for line in nf.header.splitlines() if line.startswith("void ")))
  print(f"build: cc {' '.join(BUILD_FLAGS)} -Wall -Werror -c {args.name}.c   "
        f"(link your program with {args.name}.o -lm; add -fopenmp for threads)")
  if args.check: check(nf, model, args.batch or args.check)
  return nf


def check(nf: NumericalFunction, model: DigitsCNN, n: int) -> None:
  """Run the exported C natively on the first `n` held-out test digits (train_digits.py's split)
  and compare with unigrad's model."""
  _, (xs, ys) = split(*load_digits())
  x = Tensor(xs[:n], dtype=dtypes.float32)
  got, ref = nf(x), model(x)
  assert isinstance(got, Tensor)
  diff = (got - ref).abs().max().item()
  pred = got.argmax(-1).tolist()
  agree = sum(int(p == r) for p, r in zip(pred, ref.argmax(-1).tolist()))
  right = sum(int(p == y) for p, y in zip(pred, ys[:n]))
  print(f"C vs unigrad on {n} test digits: max |difference| {diff:.3g}, same prediction "
        f"{agree}/{n}, C correct {right}/{n}")


if __name__ == "__main__":
  main()
