"""PyTorch's module habits: `nn.Module`, `nn.Sequential`, `nn.ModuleList`, `nn.Dropout`.

unigrad's layers are plain objects (tinygrad's style: any object holding tensors is a model, and
`nn.state.get_state_dict` walks its attributes). `Module` adds what a program ported from PyTorch
calls on its models:
- attributes are registered by assignment: tensors with `requires_grad=True` (the layers'
  weights, `nn.Parameter(t)`) are parameters, other tensors are buffers (BatchNorm's running
  statistics, `register_buffer`), and any other object holding tensors (a Module, a unigrad layer,
  a list of them) is a child;
- `parameters()`, `named_parameters()`, `buffers()`, `named_buffers()`, `children()`,
  `modules()`, `state_dict()`, `load_state_dict()`, `zero_grad()`;
- `train(mode=True)` / `eval()` set `training` on the module and every Module below it. A Module
  starts in training mode, as in PyTorch, and its call runs `forward` with `Tensor.training` set to
  its `training`, so the layers inside (BatchNorm, dropout) follow `model.train()` /
  `model.eval()`.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

from unigrad.frontend.tensor import Tensor
from unigrad.nn import state

__all__ = ["Module", "Sequential", "ModuleList", "Dropout", "Parameter"]


def Parameter(t: Tensor, requires_grad: bool = True) -> Tensor:  # noqa: N802 (torch.nn.Parameter)
  """`t` as a parameter: its own buffer (realized lazily), `requires_grad` set."""
  t = t.contiguous() if requires_grad else t.detach().contiguous()
  t.requires_grad = requires_grad
  return t


class Module:
  """Base class of PyTorch-style models: subclass it, assign layers and tensors in `__init__`,
  write `forward`; `model(x)` calls `forward(x)`."""

  training: bool = True

  def __init__(self) -> None:
    object.__setattr__(self, "training", True)

  def forward(self, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(f"{type(self).__name__} has no forward()")

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    with Tensor.train(self.training):
      return self.forward(*args, **kwargs)

  # ---- registration ----
  def register_buffer(self, name: str, t: Tensor | None) -> None:
    """A tensor that is state but not a parameter (in `state_dict`, never trained)."""
    if t is not None: t.requires_grad = False
    setattr(self, name, t)

  def register_parameter(self, name: str, t: Tensor | None) -> None:
    setattr(self, name, None if t is None else Parameter(t))

  def add_module(self, name: str, module: Any) -> None: setattr(self, name, module)

  def _items(self) -> Iterator[tuple[str, Any]]:
    for k, v in vars(self).items():
      if k != "training" and not k.startswith("_"): yield k, v

  def children(self) -> Iterator[Any]:
    """The direct sub-models (every attribute that holds tensors but is not one)."""
    for _, c in self.named_children(): yield c

  def named_children(self) -> Iterator[tuple[str, Any]]:
    for k, v in self._items():
      if not isinstance(v, Tensor) and state.get_state_dict(v): yield k, v

  def modules(self) -> Iterator[Module]:
    """This module and every Module below it (depth first, each once)."""
    seen: set[int] = set()

    def walk(obj: Any) -> Iterator[Module]:
      if id(obj) in seen: return
      seen.add(id(obj))
      if isinstance(obj, Module):
        yield obj
        for _, v in obj._items(): yield from walk(v)
      elif isinstance(obj, (list, tuple)):
        for v in obj: yield from walk(v)
      elif isinstance(obj, dict):
        for v in obj.values(): yield from walk(v)
    yield from walk(self)

  # ---- tensors ----
  def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
    """Every tensor by dotted name in PyTorch's order: this module's parameters, then its
    buffers, then each child's (PyTorch's keys for its layers)."""
    own = [(k, v) for k, v in self._items() if isinstance(v, Tensor)]
    out = {f"{prefix}{k}": v for k, v in own if v.requires_grad}
    out.update({f"{prefix}{k}": v for k, v in own if not v.requires_grad})
    for k, v in self._items():
      if isinstance(v, Module): out.update(v.state_dict(f"{prefix}{k}."))
      elif not isinstance(v, Tensor): out.update(state.get_state_dict(v, f"{prefix}{k}."))
    return out

  def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> Any:
    return state.load_state_dict(self, state_dict, strict=strict)

  def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of the tensors with `requires_grad=True`, each once."""
    seen: set[int] = set()
    for k, t in self.state_dict().items():
      if t.requires_grad and id(t) not in seen:
        seen.add(id(t))
        yield k, t

  def parameters(self) -> Iterator[Tensor]:
    for _, t in self.named_parameters(): yield t

  def named_buffers(self) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of the other tensors (running statistics, counters)."""
    seen: set[int] = set()
    for k, t in self.state_dict().items():
      if not t.requires_grad and id(t) not in seen:
        seen.add(id(t))
        yield k, t

  def buffers(self) -> Iterator[Tensor]:
    for _, t in self.named_buffers(): yield t

  def zero_grad(self, set_to_none: bool = True) -> None:
    for p in self.parameters(): p.grad = None

  # ---- mode ----
  def train(self, mode: bool = True) -> Module:
    """Training mode for this module and every Module below it; returns self."""
    if not isinstance(mode, bool): raise ValueError(f"training mode is expected to be boolean, "
                                                    f"got {type(mode).__name__}")
    for m in self.modules(): object.__setattr__(m, "training", mode)
    return self

  def eval(self) -> Module: return self.train(False)

  def requires_grad_(self, requires_grad: bool = True) -> Module:
    for p in self.parameters(): p.requires_grad = requires_grad
    return self

  def __repr__(self) -> str:
    lines = [f"  ({k}): {v!r}".replace("\n", "\n  ") for k, v in self.named_children()]
    return f"{type(self).__name__}(" + ("\n" + "\n".join(lines) + "\n" if lines else "") + ")"


class Sequential(Module):
  """Layers called in order: `Sequential(nn.Linear(4, 8), Tensor.relu, nn.Linear(8, 2))`, or from
  an OrderedDict of named layers. Children are named "0", "1", ... (PyTorch's state dict keys)."""

  def __init__(self, *layers: Any) -> None:
    super().__init__()
    if len(layers) == 1 and isinstance(layers[0], OrderedDict):
      for k, v in layers[0].items(): setattr(self, k, v)
    else:
      for i, v in enumerate(layers): setattr(self, str(i), v)

  def _layers(self) -> list[Any]: return [v for _, v in self._items()]

  def forward(self, x: Any) -> Any:
    for layer in self._layers(): x = layer(x)
    return x

  def __getitem__(self, i: int | slice) -> Any:
    layers = self._layers()
    return Sequential(*layers[i]) if isinstance(i, slice) else layers[i]

  def __len__(self) -> int: return len(self._layers())
  def __iter__(self) -> Iterator[Any]: return iter(self._layers())

  def append(self, layer: Any) -> Sequential:
    setattr(self, str(len(self)), layer)
    return self


class ModuleList(Module):
  """A list of layers whose tensors are part of the model (keys "0.weight", ...)."""

  def __init__(self, modules: Iterable[Any] = ()) -> None:
    super().__init__()
    self.extend(modules)

  def _layers(self) -> list[Any]: return [v for _, v in self._items()]

  def __getitem__(self, i: int | slice) -> Any:
    layers = self._layers()
    return ModuleList(layers[i]) if isinstance(i, slice) else layers[i]

  def __setitem__(self, i: int, layer: Any) -> None:
    setattr(self, str(range(len(self))[i]), layer)

  def __len__(self) -> int: return len(self._layers())
  def __iter__(self) -> Iterator[Any]: return iter(self._layers())

  def append(self, layer: Any) -> ModuleList:
    setattr(self, str(len(self)), layer)
    return self

  def extend(self, layers: Iterable[Any]) -> ModuleList:
    for layer in layers: self.append(layer)
    return self

  def forward(self, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("ModuleList is not callable: iterate over its layers")


class Dropout(Module):
  """Zero each element with probability `p` and scale the rest by 1/(1-p) in training mode."""

  def __init__(self, p: float = 0.5) -> None:
    super().__init__()
    if not 0 <= p <= 1:
      raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    self.p = p

  def forward(self, x: Tensor) -> Tensor: return x.dropout(self.p)

  def __repr__(self) -> str: return f"Dropout(p={self.p})"
