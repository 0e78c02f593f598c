"""Test defaults: every stage's spec verifier runs (SPEC=1) and every generated load and store
checks its index against its buffer (CHECK_OOB=1), so an out-of-bounds access anywhere in the suite
fails the test that caused it. Tests marked `slow` (a feature's heaviest end-to-end check, whose
feature the default run also covers with a smaller test) run only with SLOW=1. PyTorch, the
reference of many tests, runs on one thread (see pytest_runtest_setup)."""
import os
import sys

import pytest

from unigrad.helpers import GlobalCounters
from unigrad.knobs import CHECK_OOB, SPEC
from unigrad.runtime.device import Device
from unigrad.runtime.ops_cpu import find_c_compiler

SPEC.value = max(int(SPEC.value), 1)
CHECK_OOB.value = True


@pytest.fixture(params=["PYTHON", "CPU", "CL"])
def device(request):
  """Each device that executes kernels here: the PYTHON reference interpreter, CPU (C) and CL
  (OpenCL C; PoCL runs it on the CPU)."""
  if request.param == "CPU" and find_c_compiler() is None: pytest.skip("no C compiler")
  if request.param == "CL" and not Device.device_class("CL").is_available():
    pytest.skip("no OpenCL platform")
  return request.param


@pytest.fixture
def no_kernels():
  """Fails the test if any kernel ran while it did (errors must come before anything compiles)."""
  before = GlobalCounters.kernel_count
  yield
  assert GlobalCounters.kernel_count == before, "a kernel ran"


def pytest_collection_modifyitems(config, items):
  if os.environ.get("SLOW", "0") not in ("", "0"): return
  skip = pytest.mark.skip(reason="slow: runs with SLOW=1")
  for item in items:
    if "slow" in item.keywords: item.add_marker(skip)


_torch_threads_set = False


def pytest_runtest_setup(item):
  """PyTorch on one thread once a test module has imported it: the suite runs one xdist worker
  per core, and torch's two OpenMP threads then wait on each other while the other worker holds
  a core (transformers' 16-token greedy generate of SmolLM2 took 12-30 s so, 1.3 s on one)."""
  global _torch_threads_set
  if not _torch_threads_set and (torch := sys.modules.get("torch")) is not None:
    torch.set_num_threads(1)
    _torch_threads_set = True

