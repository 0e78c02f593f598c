"""The example scripts (examples/*.py) imported by the tests that check them."""
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
  """examples/NAME.py as the module NAME_example (registered, so its dataclasses work)."""
  spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
  assert spec is not None and spec.loader is not None
  module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
