"""Code generation: from one kernel to a linear, target-ready program (see ARCHITECTURE.md)."""
