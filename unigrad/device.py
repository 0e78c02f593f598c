"""tinygrad's module path for Device and Buffer (`from unigrad.device import Device`)."""
from unigrad.runtime.device import Buffer, Device

__all__ = ["Buffer", "Device"]
