"""Neural-network building blocks: layers, PyTorch-style modules (`Module`, `Sequential`,
`ModuleList`, `Dropout`), `nn.optim` optimizers and schedulers, `nn.state` (state dicts,
safetensors, PyTorch checkpoints) and `nn.datasets` (MNIST, CIFAR-10, the shipped digits)."""
from unigrad.nn import datasets, optim, state
from unigrad.nn.layers import (BatchNorm, BatchNorm2d, Conv1d, Conv2d, ConvTranspose1d,
                               ConvTranspose2d, Embedding, GroupNorm, InstanceNorm, LayerNorm,
                               LayerNorm2d, Linear, LSTMCell, RMSNorm)
from unigrad.nn.module import Dropout, Module, ModuleList, Parameter, Sequential

__all__ = ["BatchNorm", "BatchNorm2d", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d",
           "Dropout", "Embedding", "GroupNorm", "InstanceNorm", "LayerNorm", "LayerNorm2d",
           "LSTMCell", "Linear", "Module", "ModuleList", "Parameter", "RMSNorm", "Sequential",
           "datasets", "optim", "state"]
