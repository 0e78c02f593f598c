"""tinygrad's module path for the IR's core names (`from unigrad.ops import UOp, Ops, UPat`);
everything of spec draft 002 is in `unigrad.uop`."""
from unigrad.uop import (AxisType, GroupOp, KernelInfo, Ops, ParamArg, PatternMatcher,
                         TrackedPatternMatcher, UOp, UPat, graph_rewrite, sym_infer)
from unigrad.uop.alu import exec_alu
from unigrad.uop.variable import resolve

__all__ = ["AxisType", "GroupOp", "KernelInfo", "Ops", "ParamArg", "PatternMatcher",
           "TrackedPatternMatcher", "UOp", "UPat", "exec_alu", "graph_rewrite", "resolve",
           "sym_infer"]
