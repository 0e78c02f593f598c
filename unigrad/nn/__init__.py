"""Neural-network building blocks: layers, `nn.optim` optimizers and `nn.state` (state dicts,
safetensors, PyTorch checkpoints)."""
from unigrad.nn import optim, state
from unigrad.nn.layers import (BatchNorm, BatchNorm2d, Conv1d, Conv2d, ConvTranspose1d,
                               ConvTranspose2d, Embedding, GroupNorm, InstanceNorm, LayerNorm,
                               LayerNorm2d, Linear, LSTMCell, RMSNorm)

__all__ = ["BatchNorm", "BatchNorm2d", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d",
           "Embedding", "GroupNorm", "InstanceNorm", "LayerNorm", "LayerNorm2d", "LSTMCell",
           "Linear", "RMSNorm", "optim", "state"]
