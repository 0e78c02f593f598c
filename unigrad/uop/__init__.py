"""The IR: ops, UOp, derived properties, patterns, graph rewriting, simplifier, verifiers, printers.

Every name of draft 002 is importable from here.
"""
from unigrad.dtype import AddrSpace, DType, PtrDType, dtypes
from unigrad.uop.ops import (AxisType, CallInfo, GroupOp, Invalid, KernelInfo, Ops, ParamArg,
                             RangeArg, ReduceArg)
from unigrad.uop.printer import pyrender
from unigrad.uop.rewrite import RewriteError, graph_rewrite, substitute
from unigrad.uop.spec import Spec, SpecError, spec_tensor
from unigrad.uop.symbolic import pm_simplify, sym_infer
from unigrad.uop.upat import (PatternMatcher, TrackedPatternMatcher, UPat, match_stats,
                              track_rewrites, traces)
from unigrad.uop.uop import NodeMap, UOp, all_metadata, consumer_map_from_toposort, shape_uop, sint

__all__ = ["AddrSpace", "AxisType", "CallInfo", "DType", "GroupOp", "Invalid", "KernelInfo",
           "NodeMap", "Ops", "ParamArg", "PatternMatcher", "PtrDType", "RangeArg", "ReduceArg",
           "RewriteError", "Spec", "SpecError", "TrackedPatternMatcher", "UOp", "UPat",
           "all_metadata", "consumer_map_from_toposort", "dtypes", "graph_rewrite", "match_stats",
           "pm_simplify", "pyrender", "shape_uop", "sint", "spec_tensor", "substitute", "sym_infer",
           "track_rewrites", "traces"]
