"""The schedule phase: from the tensor graph to realize to a command buffer of kernel CALLs.

Owns callify (the graph as one stateless function over PARAMs), FUNCTION resolution, the
multi-device lowering, rangeify (kernel boundaries, movement ops as index arithmetic, scatters),
the schedule order and the memory plan of intermediate buffers.
"""
