"""The frontend: `Tensor` and everything that builds the tensor graph.

Owns Tensor and its method groups (creation, movement, elementwise, reductions, indexing,
activations, nn ops, linear algebra, random numbers, multi-device), autograd (`gradient`),
in-place writes and the lazy values they must not change (`writes`), `@function`, `@traced`
and TinyJit. It builds UOps and asks the engine to realize them.
"""
