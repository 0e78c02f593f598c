"""The viewer's files: static HTML/CSS/JS from the package, and data pages as small scripts.

Every data page is a script `data/<key>.js` calling `vizLoad(key, json)`: script tags load from
`file://` where `fetch` may not, so one set of files serves both the exported viewer (opened
without a server) and the server (which builds a page on first request). Keys: `index`, `t<i>`
(a trace's source and opts), `t<i>_s<j>_p<k>` (page k of step j of trace i), `profile`.
"""
from __future__ import annotations

import json
import pathlib
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from unigrad.engine import profile
from unigrad.uop.upat import RewriteTrace
from unigrad.viz.data import build_index, build_page, build_trace_info, page_count, step_list

__all__ = ["STATIC_DIR", "Viewer", "UnknownPageError", "export"]

STATIC_DIR = pathlib.Path(__file__).resolve().parent / "static"
_PAGE_KEY = re.compile(r"^t(\d+)(?:_s(\d+)_p(\d+))?$")


class UnknownPageError(KeyError):
  """A data page that the viewer's data does not have."""


@dataclass
class Viewer:
  """The data of one viewer: the traces, the error of the traced script, profile events."""
  traces: list[RewriteTrace]
  error: str | None = None
  title: str = "unigrad viz"
  events: list[profile.ProfileEvent] = field(default_factory=list)
  _cache: dict[str, str] = field(default_factory=dict, repr=False)

  def keys(self) -> Iterator[str]:
    """Every page key, index first."""
    yield "index"
    if self.events: yield "profile"
    for i, t in enumerate(self.traces):
      yield f"t{i}"
      for j, s in enumerate(step_list(t)):
        for k in range(page_count(s)): yield f"t{i}_s{j}_p{k}"

  def data(self, key: str) -> Any:
    """The JSON-ready data of page `key` (UnknownPageError if there is none)."""
    if key == "index": return build_index(self.traces, self.error, self.title, bool(self.events))
    if key == "profile": return profile.chrome_trace(self.events)
    m = _PAGE_KEY.match(key)
    if m is None or int(m[1]) >= len(self.traces): raise UnknownPageError(key)
    trace = self.traces[int(m[1])]
    if m[2] is None: return build_trace_info(trace)
    if int(m[2]) >= len(step_list(trace)): raise UnknownPageError(key)
    return build_page(trace, int(m[2]), int(m[3]))

  def script(self, key: str) -> str:
    """Page `key` as the script the viewer loads (built once)."""
    if (s := self._cache.get(key)) is None:
      body = json.dumps(self.data(key), separators=(",", ":"), default=str)
      s = self._cache[key] = f"vizLoad({json.dumps(key)},{body});\n"
    return s


def copy_static(out: pathlib.Path) -> None:
  """The viewer's HTML, CSS and JavaScript into `out`."""
  out.mkdir(parents=True, exist_ok=True)
  for f in STATIC_DIR.iterdir():
    if f.is_file(): shutil.copyfile(f, out / f.name)


def export(viewer: Viewer, out: str | pathlib.Path) -> pathlib.Path:
  """Write the whole viewer to `out` (index.html, its scripts and every data page); returns
  the path of index.html."""
  root = pathlib.Path(out)
  copy_static(root)
  (root / "data").mkdir(exist_ok=True)
  for key in viewer.keys(): (root / "data" / f"{key}.js").write_text(viewer.script(key))
  return root / "index.html"
