"""Run under `mpiexec -n 2`: SmolLM2-135M with its feed-forward networks split over the ranks
(gate and up column-parallel, down row-parallel; the attention heads too where the ranks divide
them, which 9 heads and 3 key/value heads over 2 ranks do not) decodes greedily the tokens the
whole model decodes in one process."""
import dataclasses
import sys
import time

from unigrad import Tensor
from unigrad.llm import Generator, SamplingParams, Transformer, default_model_path
from unigrad.llm.model import Attention, Block
from unigrad.nn.quantized import as_tensor
import unigrad.distributed as dist
from unigrad.distributed import shard

PROMPT = [504, 3575, 282, 4649, 314]  # "The capital of France is"
TOKENS = 8


def idle_barrier() -> None:
  """A barrier that sleeps while it waits (MPI's spins, taking a core from a rank still
  compiling on an oversubscribed machine)."""
  req = dist.mpi.group().comm.Ibarrier()
  while not req.Test(): time.sleep(0.02)


class ParallelBlock(Block):
  """A block whose attention (heads split) and feed-forward network give partial sums that
  are all-reduced before the residual."""

  def __call__(self, x: Tensor, start_pos, cos: Tensor, sin: Tensor) -> Tensor:
    att = self.attention(self.attention_norm(x).contiguous(), start_pos, cos, sin)
    h = x + (dist.all_reduce(att) if self.heads_split else att)
    n = self.ffn_norm(h).contiguous()
    return h + dist.all_reduce(((n @ self.w_gate.T).silu() * (n @ self.w_up.T)) @ self.w_down.T)


def split_heads(att: Attention, batch: int, max_context: int) -> None:
  cfg, n = att.cfg, dist.world_size()
  att.cfg = dataclasses.replace(cfg, n_heads=cfg.n_heads // n, n_kv_heads=cfg.n_kv_heads // n)
  att.wq, att.wk, att.wv = (shard(as_tensor(w), 0).contiguous() for w in (att.wq, att.wk, att.wv))
  att.wo = shard(as_tensor(att.wo), 1).contiguous()
  shape = (batch, max_context, att.cfg.n_kv_heads, cfg.head_dim)
  att.cache_k, att.cache_v = Tensor.zeros(*shape).contiguous(), Tensor.zeros(*shape).contiguous()


def parallelize(model: Transformer) -> None:
  cfg, n = model.cfg, dist.world_size()
  heads = cfg.n_heads % n == 0 and cfg.n_kv_heads % n == 0
  for blk in model.layers:  # the packed weights' float32 shards (each rank dequantizes its own)
    blk.w_gate = shard(as_tensor(blk.w_gate), 0).contiguous()
    blk.w_up = shard(as_tensor(blk.w_up), 0).contiguous()
    blk.w_down = shard(as_tensor(blk.w_down), 1).contiguous()
    if heads: split_heads(blk.attention, blk.attention.cache_k.shape[0], model.max_context)
    blk.__class__ = ParallelBlock
    blk.heads_split = heads
  Tensor.realize_all(*(t for blk in model.layers for t in (
    blk.w_gate, blk.w_up, blk.w_down, blk.attention.wq, blk.attention.wk, blk.attention.wv,
    blk.attention.wo, blk.attention.cache_k, blk.attention.cache_v)
    if isinstance(t, Tensor)))  # unsplit attention weights stay packed


if __name__ == "__main__":
  dist.init()
  model = Transformer.from_gguf(default_model_path(), max_context=64)
  params = SamplingParams(max_tokens=TOKENS)
  whole = list(Generator(model).generate(PROMPT, params)) if dist.rank() == 0 else None
  idle_barrier()  # rank 1 sleeps while rank 0 decodes with the whole model
  parallelize(model)
  split = list(Generator(model).generate(PROMPT, params))
  if dist.rank() == 0:
    print(f"1 rank: {whole}\n{dist.world_size()} ranks: {split}")
    assert split == whole, (split, whole)
  idle_barrier()
  print(f"rank {dist.rank()} ok")
  sys.stdout.flush()
