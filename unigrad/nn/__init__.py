"""Neural-network building blocks: layers (to come), `nn.optim` optimizers and `nn.state`
(state dicts, safetensors, PyTorch checkpoints)."""
from unigrad.nn import optim, state

__all__ = ["optim", "state"]
