"""Devices, memory and kernel launch: the `Device` registry, `Buffer`, and the interfaces
(`Allocator`, `Compiler`, `Program`) each device module `ops_<name>.py` implements."""
from unigrad.runtime.device import (Allocator, Buffer, Compiled, CompileError, Compiler, Device,
                                    DeviceRegistry, LRUAllocator, OutOfBoundsError, Program)

__all__ = ["Allocator", "Buffer", "Compiled", "CompileError", "Compiler", "Device",
           "DeviceRegistry", "LRUAllocator", "OutOfBoundsError", "Program"]
