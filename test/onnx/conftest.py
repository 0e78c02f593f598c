"""The onnx_backend group (onnx's backend test suite over unigrad, and the packaged real models)
is collected only when selected: `python -m pytest -m onnx_backend test/onnx` (.ci/run runs it
as its own step). Building onnx's BackendTest alone takes about 15 s, so the
default suite does not even import these modules."""
import pytest

GROUP_MODULES = ("test_onnx_backend.py", "test_onnx_models.py")


def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "onnx_backend: onnx's backend tests and the real ONNX "
                          "models (run with -m onnx_backend)")


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
  if collection_path.name not in GROUP_MODULES: return None
  return None if config.getoption("markexpr", "").strip() == "onnx_backend" else True
