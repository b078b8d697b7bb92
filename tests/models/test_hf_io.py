"""HF Qwen3 import/export against transformers' Qwen3ForCausalLM (CPU, fp32).

Tiny random models are made and saved by transformers itself, so the reference
is independent of our mapping table.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from paraagent_jax import sampling
from paraagent_jax import sharding as shd
from paraagent_jax.models import hf_io

VOCAB = 96


def make_hf(tmp_path, name, tied=True, kv=2, seed=0, max_pos=128):
  cfg = transformers.Qwen3Config(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv,
      head_dim=8, tie_word_embeddings=tied, max_position_embeddings=max_pos,
      rope_theta=10000.0)
  torch.manual_seed(seed)
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  # Norm weights start at 1; perturb them so a swapped norm would show.
  with torch.no_grad():
    for n, p in model.named_parameters():
      if "norm" in n:
        p.add_(0.1 * torch.randn_like(p))
  d = str(tmp_path / name)
  model.save_pretrained(d)
  return model, d


def batch(pad_side, seed=1):
  rng = np.random.RandomState(seed)
  ids = rng.randint(0, VOCAB, (3, 9))
  mask = np.ones_like(ids)
  if pad_side == "left":
    mask[1, :4] = 0
    mask[2, :2] = 0
  else:
    mask[1, 5:] = 0
    mask[2, 7:] = 0
  ids = np.where(mask == 1, ids, 0)
  return ids, mask


def hf_logits(model, ids, mask):
  with torch.no_grad():
    return model(torch.tensor(ids), attention_mask=torch.tensor(mask)
                 ).logits.float().numpy()


def assert_real_close(ref, got, mask, atol=1e-4):
  real = mask.astype(bool)
  assert np.abs(ref[real]).max() > 1e-3      # logits are not trivially zero
  np.testing.assert_allclose(got[real], ref[real], atol=atol, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("tied,kv", [(True, 2), (False, 4), (False, 2)])
def test_logits_match_transformers_with_padding(tmp_path, tied, kv):
  hf, d = make_hf(tmp_path, "m", tied=tied, kv=kv)
  ours = hf_io.load_hf(d)
  assert ours.config.tie_embeddings == tied
  assert ours.config.num_kv_heads == kv
  for pad_side in ("left", "right"):
    ids, mask = batch(pad_side)
    got = np.asarray(ours(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    assert_real_close(hf_logits(hf, ids, mask), got, mask)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["auto", "chunked", "reference", "xla"])
def test_logits_match_transformers_at_2048_tokens(tmp_path, attention):
  """Rows of 2,048 tokens (right- and left-padded) through every CPU path.

  "chunked" runs blocks of 256 (8 query blocks: the causal block skipping is
  exercised); "auto" is the reference path in query blocks of 128 at this
  length on the CPU; kv 2 of 4 heads is GQA 2.
  """
  hf, d = make_hf(tmp_path, "long", kv=2, max_pos=4096)
  ours = hf_io.load_hf(d)
  ours.config = ours.config.replace(attention=attention)
  rng = np.random.RandomState(5)
  t = 2048
  ids = rng.randint(0, VOCAB, (2, t))
  mask = np.ones_like(ids)
  mask[0, t - 300:] = 0          # right padding
  mask[1, :77] = 0               # left padding
  ids = np.where(mask == 1, ids, 0)
  got = np.asarray(ours(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
  assert_real_close(hf_logits(hf, ids, mask), got, mask)


def test_export_loads_in_transformers_and_roundtrip_is_exact(tmp_path):
  hf, d = make_hf(tmp_path, "m", tied=False, kv=2)
  ours = hf_io.load_hf(d)
  out = str(tmp_path / "export")
  hf_io.save_hf(ours, out)
  cfg = json.load(open(os.path.join(out, "config.json")))
  assert cfg["architectures"] == ["Qwen3ForCausalLM"]
  assert cfg["torch_dtype"] == "float32"
  assert os.path.isfile(os.path.join(out, "generation_config.json"))
  # Readable by others like the JSON beside it (safetensors writes 0600).
  assert os.stat(os.path.join(out, hf_io.SINGLE_FILE)).st_mode & 0o777 == 0o644
  back = transformers.AutoModelForCausalLM.from_pretrained(
      out, local_files_only=True).eval()
  # Tensor for tensor, the export equals what transformers wrote.
  ref_sd, back_sd = hf.state_dict(), back.state_dict()
  assert set(ref_sd) == set(back_sd)
  for k in ref_sd:
    np.testing.assert_array_equal(back_sd[k].numpy(), ref_sd[k].numpy(), k)
  ids, mask = batch("left")
  assert_real_close(hf_logits(hf, ids, mask), hf_logits(back, ids, mask), mask)
  again = hf_io.load_hf(out)
  for a, b in zip(jax.tree.leaves(jax.tree.map(np.asarray, _pure(ours))),
                  jax.tree.leaves(jax.tree.map(np.asarray, _pure(again)))):
    np.testing.assert_array_equal(a, b)


def _pure(model):
  from flax import nnx  # pylint: disable=g-import-not-at-top
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


@pytest.mark.slow
def test_sharded_safetensors_load_and_scan_layers(tmp_path):
  hf, d = make_hf(tmp_path, "m", tied=True, kv=2)
  ours = hf_io.load_hf(d)
  out = str(tmp_path / "sharded")
  names = hf_io.save_hf(ours, out, max_shard_bytes=20_000)
  assert len(names) > 2
  index = json.load(open(os.path.join(out, hf_io.INDEX_FILE)))
  assert set(index["weight_map"].values()) == set(names)
  ids, mask = batch("right")
  ref = hf_logits(hf, ids, mask)
  for kw in ({}, {"scan_layers": True}):
    m = hf_io.load_hf(out, **kw)
    got = np.asarray(m(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    assert_real_close(ref, got, mask)
  # transformers also reads our sharded layout.
  back = transformers.AutoModelForCausalLM.from_pretrained(
      out, local_files_only=True).eval()
  assert_real_close(ref, hf_logits(back, ids, mask), mask)


@pytest.mark.slow
def test_load_onto_8_device_mesh_is_split_and_matches(tmp_path):
  assert jax.device_count() == 8
  hf, d = make_hf(tmp_path, "m", tied=False, kv=2)
  mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  ours = hf_io.load_hf(d, mesh=mesh)
  pure = _pure(ours)
  embed = pure["embed_tokens"]
  assert not embed.sharding.is_fully_replicated
  assert embed.sharding.mesh.shape == mesh.shape
  q = pure["layers"][0]["q_proj"]
  assert not q.sharding.is_fully_replicated
  assert q.addressable_shards[0].data.size < q.size
  ids, mask = batch("left")
  got = np.asarray(ours(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
  assert_real_close(hf_logits(hf, ids, mask), got, mask)


def test_greedy_generation_matches_transformers(tmp_path):
  hf, d = make_hf(tmp_path, "m", tied=True, kv=2, seed=3)
  ours = hf_io.load_hf(d)
  prompts = [[5, 17, 33, 2, 8], [40, 41, 42]]
  out = sampling.generate(ours, prompts, max_new_tokens=8, temperature=0.0)
  tokens = np.asarray(out.tokens)
  for b, p in enumerate(prompts):
    with torch.no_grad():
      ref = hf.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False,
                        eos_token_id=None, pad_token_id=0,
                        attention_mask=torch.ones(1, len(p), dtype=torch.long))
    assert list(tokens[b, :8]) == ref[0, len(p):].tolist()


# ---------------------------------------------------------------------------
# Bad checkpoints: each refused with a message that names the problem.
# ---------------------------------------------------------------------------


def test_missing_dir_config_and_weights(tmp_path):
  with pytest.raises(OSError, match="not found"):
    hf_io.load_hf(str(tmp_path / "nope"))
  os.makedirs(tmp_path / "empty")
  with pytest.raises(OSError, match="no config.json"):
    hf_io.load_hf(str(tmp_path / "empty"))
  _, d = make_hf(tmp_path, "m")
  os.remove(os.path.join(d, "model.safetensors"))
  with pytest.raises(OSError, match="neither model.safetensors"):
    hf_io.load_hf(d)


def test_missing_key_shape_mismatch_architecture_corrupt(tmp_path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  _, d = make_hf(tmp_path, "m", tied=False)
  st = os.path.join(d, "model.safetensors")
  tensors = load_file(st)
  missing = dict(tensors)
  del missing["model.layers.1.mlp.up_proj.weight"]
  save_file(missing, st, metadata={"format": "pt"})
  with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"):
    hf_io.load_hf(d)
  wrong = dict(tensors)
  wrong["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)
  save_file(wrong, st, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"k_proj.weight.*\(8, 32\).*\(16, 32\)"):
    hf_io.load_hf(d)
  save_file(tensors, st, metadata={"format": "pt"})
  with open(st, "r+b") as f:
    f.write(b"\xff" * 16)
  with pytest.raises(OSError, match="corrupt safetensors"):
    hf_io.load_hf(d)
  cfg_path = os.path.join(d, "config.json")
  cfg = json.load(open(cfg_path))
  cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
  json.dump(cfg, open(cfg_path, "w"))
  with pytest.raises(ValueError, match="unsupported architecture"):
    hf_io.load_hf(d)
