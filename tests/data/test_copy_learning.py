"""A fast learning test: the demo tokenizer and a small Qwen3 learn to copy
provider names that they never saw in training.

A ParaAct policy copies its context: the provider of the instruction into a
search query, a value into a call. The test trains the demo BPE
(`tokenizer.train_bpe_tokenizer`) and a 2-layer model (the project's Qwen3,
SFT loss and optimizer) on rows of train-split providers only::

  <|im_start|>user
  Task: On Triraon, find the waitlist 'sierra'.<|im_end|>
  <|im_start|>assistant
  {"query": "Triraon search waitlist", "value": "sierra"}<|im_end|>

then measures teacher-forced accuracy on the copied words (provider name,
noun, value) of rows whose providers are test-split ones, never in a
training row and not in the tokenizer's training text. In the instruction a
name follows a space, in the assistant turn a quote: with the old GPT-2
pre-tokenizer the two occurrences had different ids and held-out copying
stayed far below the bar. A change that breaks copyability (tokenizer,
attention, masks, loss) fails here.
"""

import random

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.models import qwen3
from paraagent_jax.learner import sft_loss
from paraagent_jax.learner import optimizer as optim
from toolenv.catalog import procedural
from toolenv.executor import digest
from toolenv.tasks import TEST_FRACTION
import pytest

NOUNS = ("waitlist", "invoice", "gym", "ticket", "order", "booking", "playlist",
         "account", "station", "recipe", "device", "shipment")
STEPS, BATCH, LR = 400, 32, 2e-3


def _names():
  """Procedural provider names, split like `toolenv.TaskGenerator` splits them."""
  names = [b.capitalize() for b in procedural.brand_names(random.Random("procedural-0"))]
  test = [n for n in names if digest("split", 0, n) % 1000 < TEST_FRACTION * 1000]
  train = [n for n in names if n not in set(test)]
  return train, test


def _row(rng, name):
  noun = rng.choice(NOUNS)
  value = "".join(rng.choice("abcdefghiklmnoprstuvz") for _ in range(rng.randint(4, 7)))
  user = f"Task: On {name}, find the {noun} '{value}'."
  assistant = f'{{"query": "{name} search {noun}", "value": "{value}"}}'
  return user, assistant, (name, noun, value)


def _encode(enc, tok, user, assistant, words, seq_len):
  prompt = enc.turn_ids("user", user) + enc.generation_prompt_ids()
  text = tok_lib.render_messages([{"role": "assistant", "content": assistant}])
  reply = enc.encode(text[len(tok_lib.IM_START + "assistant\n"):])
  ids = prompt + reply
  assert len(ids) <= seq_len, len(ids)
  loss = [0] * len(prompt) + [1] * len(reply)
  # Positions of the copied words' tokens in the reply (offsets of the text).
  offs = tok(assistant, add_special_tokens=False, return_offsets_mapping=True)
  copied, cursor = [], 0
  for w in words:
    s = assistant.index(w, cursor)
    cursor = s + len(w)
    copied += [len(prompt) + i for i, (a, b) in enumerate(offs["offset_mapping"])
               if a < cursor and b > s]
  return ids, loss, copied


def _batch(rows, pad, seq_len):
  b = len(rows)
  tokens = np.full((b, seq_len), pad, np.int32)
  loss = np.zeros((b, seq_len), np.float32)
  att = np.zeros((b, seq_len), np.int32)
  for r, (ids, lm, _) in enumerate(rows):
    tokens[r, :len(ids)], loss[r, :len(ids)], att[r, :len(ids)] = ids, lm, 1
  return tokens, loss, att


@pytest.mark.slow
def test_small_model_copies_unseen_provider_names():
  train_names, test_names = _names()
  assert len(test_names) > 50 and not set(test_names) & set(train_names)
  rng = random.Random(0)
  texts = []
  for _ in range(3000):
    u, a, _ = _row(rng, rng.choice(train_names))
    texts.append(tok_lib.render_messages([{"role": "user", "content": u},
                                          {"role": "assistant", "content": a}]))
  tok = tok_lib.train_bpe_tokenizer(texts, vocab_size=512)
  enc = tok_lib.ChatEncoder(tok)
  seq_len = 64

  def rows(names, n, seed):
    r = random.Random(seed)
    return [_encode(enc, tok, *_row(r, r.choice(names)), seq_len) for _ in range(n)]

  held_out = rows(test_names, 256, 1)
  # The copies are id-to-id: each copied word's ids occur in the prompt.
  for ids, lm, copied in held_out[:32]:
    prompt = ids[:lm.index(1)]
    assert copied and all(ids[i] in prompt for i in copied)

  cfg = qwen3.Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=256,
                          num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16,
                          max_position_embeddings=seq_len)
  model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  tx = optim.make_optimizer(dict(learning_rate=LR, warmup_steps=20, total_steps=STEPS,
                              schedule="constant", weight_decay=0.0))
  graphdef, params = nnx.split(model)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, tokens, loss_mask, att):
    def loss_fn(p):
      return sft_loss.sft_loss(nnx.merge(graphdef, p), tokens, loss_mask, att)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  pad = tok.pad_token_id
  for i in range(STEPS):
    tokens, loss_mask, att = _batch(rows(train_names, BATCH, 100 + i), pad, seq_len)
    params, opt_state, loss = step(params, opt_state, tokens, loss_mask, att)
  assert np.isfinite(float(loss))

  tokens, _, att = _batch(held_out, pad, seq_len)
  logits = nnx.merge(graphdef, params)(jnp.asarray(tokens), attention_mask=jnp.asarray(att))
  pred = np.asarray(jnp.argmax(logits, -1))
  hits = [pred[r, i - 1] == tokens[r, i] for r, (_, _, copied) in enumerate(held_out)
          for i in copied]
  acc = float(np.mean(hits))
  print(f"held-out copy accuracy {acc:.3f} over {len(hits)} tokens; last train loss "
        f"{float(loss):.3f}")
  assert acc >= 0.90, f"held-out copy accuracy {acc:.3f} < 0.90"
