"""Shared by the export tests: models, byte comparison and a C driver program."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from unigrad import Tensor, nn
from unigrad.runtime.ops_cpu import find_c_compiler

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from train_digits import DigitsCNN  # noqa: E402

__all__ = ["DigitsCNN", "MLP", "same_bits", "needs_cc", "build_driver", "run_driver", "cc",
           "STRICT_BUILDS", "compile_strict"]

needs_cc = pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")


def cc() -> str:
  """The system C compiler (`cc`, else the one unigrad uses)."""
  return shutil.which("cc") or str(find_c_compiler())


class MLP:
  """64 -> 32 -> 10 with a GELU and a softmax head (two outputs: logits and probabilities)."""

  def __init__(self) -> None:
    self.l1, self.l2 = nn.Linear(64, 32), nn.Linear(32, 10)

  def __call__(self, x: Tensor) -> tuple[Tensor, Tensor]:
    logits = self.l2(self.l1(x).gelu())
    return logits, logits.softmax(-1)


# gcc and clang, as C11 and as C++: an exported file must build warning-free under each
STRICT_BUILDS = {"gcc": ["gcc", "-std=c11"], "clang": ["clang", "-std=c11"],
                 "g++": ["g++", "-x", "c++"], "clang++": ["clang++", "-x", "c++"]}
STRICT_FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]


def compile_strict(folder: Path, source: str, build: str) -> None:
  """Compile `source` to an object with STRICT_BUILDS[build] and -Wall -Wextra -Werror (no
  -march: the baseline target, where wide vector helpers are most likely to warn); skips when
  that compiler is missing; asserts no error and no warning."""
  argv = STRICT_BUILDS[build]
  if shutil.which(argv[0]) is None: pytest.skip(f"no {argv[0]}")
  (folder / "strict.c").write_text(source)
  cmd = [*argv, *STRICT_FLAGS, "-c", "strict.c", "-o", "strict.o"]
  proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and "warning" not in proc.stderr, f"{' '.join(cmd)}:\n{proc.stderr}"


def same_bits(a: Tensor, b: Tensor) -> bool:
  """Equal shape, dtype and bytes (NaNs included)."""
  return a.shape == b.shape and a.dtype == b.dtype and bytes(a._bytes()) == bytes(b._bytes())


DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "{name}.h"
/* {name}_driver IN OUT: reads the inputs (raw, one after another) from IN, writes the outputs */
int main(int argc, char **argv) {{
  if (argc != 3) {{ fprintf(stderr, "usage: %s IN OUT\n", argv[0]); return 2; }}
  FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
  if (!in || !out) return 3;
{decls}
{reads}
  {name}({args});
{writes}
  fclose(in); fclose(out);
  return 0;
}}
"""


def build_driver(folder: Path, name: str, source: str, header: str,
                 ins: list[tuple[str, int]], outs: list[tuple[str, int]],
                 batch: int | None = None, cxx: str | None = None) -> Path:
  """Write NAME.c/.h and a driver reading `ins` ((C type, count) each) from a file and writing
  `outs`; compile them with `cc -std=c11 -O2 -Wall -Werror` (or all as C++ with `cxx`);
  returns the executable."""
  (folder / f"{name}.c").write_text(source)
  (folder / f"{name}.h").write_text(header)
  arrays = [(f"in{i}", t, n) for i, (t, n) in enumerate(ins)]
  arrays += [(f"out{i}", t, n) for i, (t, n) in enumerate(outs)]
  decls = "\n".join(f"  {t} *{v} = ({t}*)malloc(sizeof({t}) * {max(n, 1)});" for v, t, n in arrays)
  reads = "\n".join(f"  if (fread(in{i}, sizeof({t}), {n}, in) != {n}) return 4;"
                    for i, (t, n) in enumerate(ins))
  writes = "\n".join(f"  fwrite(out{i}, sizeof({t}), {n}, out);" for i, (t, n) in enumerate(outs))
  args = ", ".join(([str(batch)] if batch is not None else []) + [v for v, _, _ in arrays])
  driver = DRIVER.format(name=name, decls=decls, reads=reads, writes=writes, args=args)
  (folder / "driver.c").write_text(driver)
  exe = folder / f"{name}_driver"
  lang = ["-x", "c++"] if cxx else ["-std=c11"]
  cmd = [cxx or cc(), *lang, "-O2", "-Wall", "-Werror", "driver.c", f"{name}.c", "-o", str(exe),
         "-lm"]
  proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  return exe


def run_driver(exe: Path, inputs: list[Tensor]) -> bytes:
  """Run the driver on the inputs' bytes; returns what it wrote."""
  folder = exe.parent
  (folder / "in.bin").write_bytes(b"".join(bytes(t._bytes()) for t in inputs))
  proc = subprocess.run([str(exe), "in.bin", "out.bin"], cwd=folder, capture_output=True,
                        text=True, timeout=60, env={**os.environ})
  assert proc.returncode == 0, proc.stderr
  return (folder / "out.bin").read_bytes()
