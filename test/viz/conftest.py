"""The exported viewer of a small training step that raises after it (shared by the tests)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).parent / "train_step_script.py"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def read_page(path: pathlib.Path) -> dict:
  """The JSON of a data page script `vizLoad("key",{...});`."""
  text = path.read_text()
  return json.loads(text[text.index(",") + 1:text.rindex(")")])


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
  """`python -m unigrad.viz --profile --export DIR train_step_script.py --fail`: (DIR, result)."""
  out = tmp_path_factory.mktemp("viz")
  env = {**os.environ, "PROFILE_PATH": str(out / "profile.json")}
  res = subprocess.run([sys.executable, "-m", "unigrad.viz", "--profile", "--export",
                        str(out / "viewer"), str(SCRIPT), "--fail"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  return out, res
