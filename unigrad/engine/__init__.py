"""The engine: runs what the schedule and codegen produce.

Owns realize (callify, schedule and codegen caches, buffers, the launch plan, running a command
buffer on its devices), the JIT's capture and replay of launches, the compile caches across
processes (`compcache`), Ctrl-C deferred across a realize (`interrupts`) and the profiler.
"""
