"""Code generation: one kernel AST to the spec's PROGRAM(LINEAR, SOURCE, BINARY).

Owns the codegen pipeline as a table of stages (pipeline.py): simplify, optimize (opt/: OptOps,
heuristics, BEAM), local reduce, expand, GPU dims, instruction selection, index dtype, vectorize,
transpose sums, coalesce and linearize to a LINEAR, then render and compile with the device's
renderer and compiler into a PROGRAM (program.py). Decisions it makes for the scheduler to ask
about (whether a matmul runs in place, the vector range) are functions here, read as data
downstream (KernelInfo).
"""
