"""The schedule phase: from the tensor graph to realize to a command buffer of kernel CALLs.

Owns callify (the graph as one stateless function over PARAMs), FUNCTION resolution, the
multi-device lowering (multi.py; the storage of shards: sharding.py), rangeify (kernel building:
rangeify.py; which values get a kernel, the fusion policy as rule tables: fusion.py, with its
questions about regions, probes and matmul operands in regions.py, probe.py, matmul.py; movement
ops as index arithmetic: indexing.py; scatters: scatter.py), the schedule order and the memory
plan of intermediate buffers. Where a decision is codegen's (whether a matmul runs in place),
the scheduler asks codegen (codegen/opt/heuristic.py's runs_in_place) instead of predicting it.
"""
