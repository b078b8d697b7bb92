"""Hugging Face Qwen3 checkpoints <-> our `qwen3.Qwen3` (safetensors both ways).

One declarative table, `MAPPING`, says for every parameter which HF key holds
it and how its layout differs; `load_hf` and `save_hf` both read it, so the two
directions cannot drift apart.

Layouts (ours <- HF ``nn.Linear.weight`` which is ``[out, in]``):
  q_proj [D,N,H] <- [N*H, D]   (transpose, split heads)
  k/v_proj [D,K,H] <- [K*H, D]
  o_proj [N,H,D] <- [D, N*H]   (transpose, split heads)
  gate/up_proj [D,F] <- [F,D]; down_proj [F,D] <- [D,F]; lm_head [D,V] <- [V,D]
  embeddings and norms: identical.

Loading is lazy: the model is built abstractly (`nnx.eval_shape`), then each
tensor is read on its own with `safetensors.safe_open` and placed straight on
its NamedSharding, so at most one tensor is on the host at a time.
"""

import dataclasses
import json
import os
from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors import SafetensorError
import safetensors.numpy as st_numpy

from paraagent_jax import checksums
from paraagent_jax import fileio
from paraagent_jax import sharding as shd
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.models import qwen3

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


# ----------------------------------------------------------------------------
# The mapping table.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
  """One parameter: our name, its HF key, and the two layout conversions.

  `to_ours(w, cfg)` maps the HF array to our layout, `to_hf(w, cfg)` back.
  `per_layer` entries are formatted with the layer index ``{i}``.
  """
  ours: str
  hf: str
  to_ours: Callable[[np.ndarray, qwen3.Qwen3Config], np.ndarray]
  to_hf: Callable[[np.ndarray, qwen3.Qwen3Config], np.ndarray]
  per_layer: bool = False


def _same(w, cfg):
  del cfg
  return w


def _t(w, cfg):
  del cfg
  return w.T


def _in_heads(heads: str):
  """[heads*H, D] <-> [D, heads, H] (q/k/v projections)."""
  def to_ours(w, cfg):
    return w.T.reshape(cfg.hidden_size, getattr(cfg, heads), cfg.head_dim)

  def to_hf(w, cfg):
    return w.reshape(cfg.hidden_size, -1).T
  return to_ours, to_hf


def _out_heads_to_ours(w, cfg):
  return w.T.reshape(cfg.num_heads, cfg.head_dim, cfg.hidden_size)


def _out_heads_to_hf(w, cfg):
  return w.reshape(-1, cfg.hidden_size).T


_LP = "model.layers.{i}."
MAPPING: tuple[Entry, ...] = (
    Entry("embed_tokens", "model.embed_tokens.weight", _same, _same),
    Entry("attn_norm", _LP + "input_layernorm.weight", _same, _same, True),
    Entry("q_proj", _LP + "self_attn.q_proj.weight", *_in_heads("num_heads"),
          True),
    Entry("k_proj", _LP + "self_attn.k_proj.weight", *_in_heads("num_kv_heads"),
          True),
    Entry("v_proj", _LP + "self_attn.v_proj.weight", *_in_heads("num_kv_heads"),
          True),
    Entry("o_proj", _LP + "self_attn.o_proj.weight", _out_heads_to_ours,
          _out_heads_to_hf, True),
    Entry("q_norm", _LP + "self_attn.q_norm.weight", _same, _same, True),
    Entry("k_norm", _LP + "self_attn.k_norm.weight", _same, _same, True),
    Entry("mlp_norm", _LP + "post_attention_layernorm.weight", _same, _same,
          True),
    Entry("gate_proj", _LP + "mlp.gate_proj.weight", _t, _t, True),
    Entry("up_proj", _LP + "mlp.up_proj.weight", _t, _t, True),
    Entry("down_proj", _LP + "mlp.down_proj.weight", _t, _t, True),
    Entry("norm", "model.norm.weight", _same, _same),
    Entry("lm_head", "lm_head.weight", _t, _t),
)


def _entries(cfg: qwen3.Qwen3Config):
  """(entry, layer index or None, HF key) for every tensor of `cfg`."""
  for e in MAPPING:
    if e.ours == "lm_head" and cfg.tie_embeddings:
      continue
    if e.per_layer:
      for i in range(cfg.num_layers):
        yield e, i, e.hf.format(i=i)
    else:
      yield e, None, e.hf


def _get(pure: dict, cfg, e: Entry, i):
  if i is None:
    return pure[e.ours]
  if cfg.scan_layers:
    return pure["layers"][e.ours]     # stacked [L, ...]; caller slices
  return pure["layers"][i][e.ours]


# ----------------------------------------------------------------------------
# Reading.
# ----------------------------------------------------------------------------


def _read_config(path: str) -> dict[str, Any]:
  if not fileio.isdir(path):
    raise FileNotFoundError(f"HF checkpoint directory not found: {path}")
  cfg_path = os.path.join(path, "config.json")
  if not fileio.isfile(cfg_path):
    raise FileNotFoundError(f"{path}: no config.json")
  try:
    with fileio.open(cfg_path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{cfg_path}: not valid JSON ({e})") from None


def _weight_map(path: str) -> dict[str, str]:
  """HF key -> safetensors file name (single file or sharded with index)."""
  index = os.path.join(path, INDEX_FILE)
  if fileio.isfile(index):
    try:
      with fileio.open(index) as f:
        wm = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
      raise ValueError(f"{index}: not a safetensors index ({e})") from None
    for fname in set(wm.values()):
      if not fileio.isfile(os.path.join(path, fname)):
        raise FileNotFoundError(f"{path}: shard {fname} named in {INDEX_FILE} "
                                f"is missing")
    return wm
  single = os.path.join(path, SINGLE_FILE)
  if not fileio.isfile(single):
    raise FileNotFoundError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE}")
  with _open(single) as f:
    return {k: SINGLE_FILE for k in f.keys()}


class _InMemory:
  """A safetensors file read whole from a bucket, with `safe_open`'s
  ``keys`` / ``get_tensor`` (safetensors opens local files only)."""

  def __init__(self, fname: str):
    try:
      self._tensors = st_numpy.load(fileio.open(fname, "rb").read())
    except SafetensorError as e:
      raise OSError(f"{fname}: corrupt safetensors file ({e})") from None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._tensors = {}

  def keys(self):
    return list(self._tensors)

  def get_tensor(self, key: str) -> np.ndarray:
    return self._tensors[key]


def _open(fname: str):
  if fileio.is_remote(fname):
    return _InMemory(fname)
  try:
    return safe_open(fname, framework="np")
  except SafetensorError as e:
    raise OSError(f"{fname}: corrupt safetensors file ({e})") from None


class _Reader:
  """Opens each shard once and reads tensors one at a time."""

  def __init__(self, path: str):
    self.path = path
    self.weight_map = _weight_map(path)
    self._files = {}

  def get(self, key: str) -> np.ndarray:
    if key not in self.weight_map:
      raise KeyError(f"{self.path}: missing tensor {key!r}")
    fname = os.path.join(self.path, self.weight_map[key])
    if fname not in self._files:
      self._files[fname] = _open(fname).__enter__()
    try:
      return self._files[fname].get_tensor(key)
    except SafetensorError as e:
      raise OSError(f"{fname}: corrupt safetensors file reading {key!r} "
                    f"({e})") from None

  def close(self):
    for f in self._files.values():
      f.__exit__(None, None, None)
    self._files = {}


def load_hf(path: str, mesh=None, dtype=jnp.float32, rules=None,
            **config_overrides) -> qwen3.Qwen3:
  """Loads a local HF Qwen3 checkpoint directory into a `qwen3.Qwen3`.

  Args:
    path: directory with config.json and model.safetensors (or shards plus
      model.safetensors.index.json).
    mesh: if given, each parameter is placed on its NamedSharding (from its
      logical axes and `rules`) as it is read, and the model's sharding context
      is set; else parameters go to the default device.
    dtype: parameter dtype (the checkpoint's values are cast).
    rules: logical-axis rules for `mesh` (default `sharding.DEFAULT_RULES`).
    **config_overrides: extra `Qwen3Config` fields (e.g. scan_layers=True).

  Returns:
    The model.

  Raises:
    FileNotFoundError: missing directory, config.json or weight files.
    OSError: a corrupt safetensors file.
    ValueError: unsupported architecture, a tensor of the wrong shape, or a
      file that does not match the directory's SHA256SUMS.
    KeyError: a tensor the config requires is missing.
  """
  hf_cfg = _read_config(path)
  checksums.verify_checksums(path)
  cfg = qwen3.Qwen3Config.from_hf_dict(
      hf_cfg, **{"param_dtype": jnp.dtype(dtype).name, **config_overrides})
  abstract = nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  if mesh is not None:
    shardings = shd.param_shardings(state, mesh, shd.as_rules(rules))
    shard_pure = nnx.to_pure_dict(shardings)
  pure = nnx.to_pure_dict(state)
  reader = _Reader(path)
  stacked: dict[str, list] = {}
  try:
    for e, i, key in _entries(cfg):
      w = reader.get(key)
      target = _get(pure, cfg, e, i)
      want = target.shape[1:] if (i is not None and cfg.scan_layers) else (
          target.shape)
      try:
        w = e.to_ours(w, cfg)
      except ValueError:
        pass  # reshape failed: reported below as a shape mismatch
      if tuple(w.shape) != tuple(want):
        raise ValueError(
            f"{path}: tensor {key!r} has shape {reader.get(key).shape}, "
            f"config.json implies {tuple(e.to_hf(np.zeros(want), cfg).shape)}")
      w = np.asarray(w).astype(jnp.dtype(dtype))
      if i is not None and cfg.scan_layers:
        stacked.setdefault(e.ours, []).append(w)
        if i < cfg.num_layers - 1:
          continue
        w = np.stack(stacked.pop(e.ours))
      if mesh is not None:
        sh = (shard_pure["layers"][e.ours] if cfg.scan_layers else
              _get(shard_pure, cfg, e, i)) if i is not None else shard_pure[e.ours]
        arr = jax.make_array_from_callback(w.shape, sh, lambda idx, w=w: w[idx])
      else:
        arr = jnp.asarray(w)
      if i is None:
        pure[e.ours] = arr
      elif cfg.scan_layers:
        pure["layers"][e.ours] = arr
      else:
        pure["layers"][i][e.ours] = arr
  finally:
    reader.close()
  nnx.replace_by_pure_dict(state, pure)
  model = nnx.merge(graphdef, state)
  if mesh is not None:
    shd.set_sharding_ctx(model, mesh, shd.as_rules(rules))
  return model


# ----------------------------------------------------------------------------
# Writing.
# ----------------------------------------------------------------------------


def hf_tensors(model: qwen3.Qwen3):
  """Yields (HF key, numpy array in HF layout), one tensor at a time."""
  cfg = model.config
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  for e, i, key in _entries(cfg):
    w = _get(pure, cfg, e, i)
    if i is not None and cfg.scan_layers:
      w = w[i]
    yield key, np.ascontiguousarray(e.to_hf(np.asarray(jax.device_get(w)), cfg))


def save_hf(model: qwen3.Qwen3, out_dir: str, tokenizer=None,
            max_shard_bytes: int = 2 * 1024 ** 3,
            generation_config: dict | None = None) -> list[str]:
  """Writes `model` as a HF Qwen3ForCausalLM directory.

  Writes config.json, model.safetensors (or model-0000k-of-0000n.safetensors
  plus the index when larger than `max_shard_bytes`), generation_config.json,
  and, given a tokenizer, its files with the ParaAct chat template.

  Args:
    model: the model (parameters may be sharded; each is gathered in turn).
    out_dir: output directory (created).
    tokenizer: a `transformers` tokenizer, or None.
    max_shard_bytes: largest shard size.
    generation_config: extra generation_config.json fields.

  Returns:
    The safetensors file names written.
  """
  cfg = model.config
  fileio.makedirs(out_dir)
  hf = cfg.to_hf_dict()
  hf["torch_dtype"] = cfg.param_dtype
  gen = {"do_sample": False}
  if tokenizer is not None:
    eos = [tokenizer.convert_tokens_to_ids(t) for t in
           (tok_lib.IM_END, tok_lib.END_OF_TEXT)]
    eos = [t for t in eos if t is not None and t != tokenizer.unk_token_id]
    if eos:
      hf["eos_token_id"] = gen["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    pad = tokenizer.convert_tokens_to_ids(tok_lib.END_OF_TEXT)
    if pad is not None:
      hf["pad_token_id"] = gen["pad_token_id"] = pad
  gen.update(generation_config or {})
  # Group tensors into shards in table order (layers stay together).
  shards, current, size = [], {}, 0
  for key, w in hf_tensors(model):
    if current and size + w.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[key] = w
    size += w.nbytes
  shards.append(current)
  for stale in fileio.listdir(out_dir) if fileio.isdir(out_dir) else ():
    if stale.endswith(".safetensors") or stale == INDEX_FILE:
      fileio.remove(os.path.join(out_dir, stale))
  names = []
  if len(shards) == 1:
    names = [SINGLE_FILE]
  else:
    names = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
             for k in range(len(shards))]
  weight_map, total = {}, 0
  for name, tensors in zip(names, shards):
    target = os.path.join(out_dir, name)
    if fileio.is_remote(target):   # one upload per shard, whole
      fileio.write_bytes_atomic(target, st_numpy.save(
          tensors, metadata={"format": "pt"}))
    else:
      st_numpy.save_file(tensors, target, metadata={"format": "pt"})
      # safetensors creates its files 0600; an export is meant to be shared
      # (copied to a hub, read by other users), like the JSON files beside it.
      os.chmod(target, 0o644)
    for k, w in tensors.items():
      weight_map[k] = name
      total += w.nbytes
  if len(shards) > 1:
    fileio.write_json_atomic(
        os.path.join(out_dir, INDEX_FILE),
        {"metadata": {"total_size": total}, "weight_map": weight_map},
        indent=1, default=None)
  fileio.write_json_atomic(os.path.join(out_dir, "config.json"), hf, indent=1,
                           default=None)
  fileio.write_json_atomic(os.path.join(out_dir, "generation_config.json"), gen,
                           indent=1, default=None)
  if tokenizer is not None:
    # The template the model was trained with: the tokenizer's own (a Qwen3
    # directory's, protocol.format=qwen3), the ParaAct one where it has none.
    if not getattr(tokenizer, "chat_template", None):
      tokenizer.chat_template = tok_lib.CHAT_TEMPLATE
    tok_lib.save_tokenizer(tokenizer, out_dir)
  return names
