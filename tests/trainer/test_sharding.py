"""Sharded Qwen3 on the 8 CPU devices: same numbers as one device, real splits.

The reference is the same model run unsharded on one device (no mesh, no
constraints): a sharded run must give the same logits and the same gradients
of a masked cross-entropy within fp32 tolerance. The cross-entropy itself is
re-derived with numpy from the reference logits. The shardings are checked
against what the rules table says, worked out by hand for each mesh.
"""

import jax
from jax.sharding import NamedSharding, PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from paraagent_jax import config_utils
from paraagent_jax import sharding as shd
from paraagent_jax.models import qwen3
from paraagent_jax.trainer import specs
from paraagent_jax.trainer import state as state_lib

# Every sharded dimension divides every mesh axis used below (sizes 1, 2, 4):
# 8 heads and 4 kv heads split 4 ways on "tensor", hidden 64 on "fsdp",
# MLP 128 and vocab 256 on "tensor", batch 8 on data x fsdp (at most 8).
CFG = qwen3.Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                        num_layers=1, num_heads=8, num_kv_heads=4, head_dim=16,
                        max_position_embeddings=512)
MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 2, 4)]
B, T = 8, 12


def _mesh(shape):
  return shd.make_mesh(dict(zip(shd.MESH_AXES, shape)),
                       devices=jax.devices()[:int(np.prod(shape))])


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
  lengths = rng.integers(T // 2, T + 1, (B,))
  attn = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
  # Loss on a random subset of real tokens (as SFT masks assistant turns).
  loss_mask = (attn * (rng.random((B, T)) < 0.7)).astype(np.float32)
  loss_mask[:, 0] = 0.0
  return tokens, attn, loss_mask


def _masked_ce(model, tokens, attn, loss_mask):
  logits = model(tokens, attention_mask=attn)
  logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  m = loss_mask[:, 1:]
  return -jnp.sum(picked * m) / jnp.sum(m)


def _logits_and_grads(model, tokens, attn, loss_mask, mesh=None):
  graphdef, state = nnx.split(model)

  def f(state, tokens, attn, loss_mask):
    m = nnx.merge(graphdef, state)
    return (_masked_ce(m, tokens, attn, loss_mask),
            m(tokens, attention_mask=attn))

  batch = (tokens, attn, loss_mask)
  if mesh is not None:
    data = NamedSharding(mesh, P(("data", "fsdp")))
    batch = tuple(jax.device_put(x, data) for x in batch)
  return jax.jit(jax.value_and_grad(f, has_aux=True))(state, *batch)


@pytest.fixture(scope="module")
def reference():
  """Unsharded logits, loss and gradients on one device."""
  tokens, attn, loss_mask = _batch()
  model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(3))
  cpu0 = jax.devices()[0]
  state = jax.device_put(nnx.state(model), cpu0)
  nnx.update(model, state)
  (loss, logits), grads = _logits_and_grads(model, tokens, attn, loss_mask)
  return dict(loss=loss, logits=np.asarray(logits),
              grads=nnx.to_pure_dict(grads), batch=(tokens, attn, loss_mask))


def test_reference_loss_matches_numpy_cross_entropy(reference):
  tokens, _, loss_mask = reference["batch"]
  logits = reference["logits"].astype(np.float64)[:, :-1]
  shifted = logits - logits.max(-1, keepdims=True)
  logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  picked = np.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  want = -(picked * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum()
  np.testing.assert_allclose(float(reference["loss"]), want, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_sharded_logits_and_grads_match_one_device(reference, shape):
  mesh = _mesh(shape)
  model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(3))
  shd.shard_model(model, mesh)
  if shape[1] * shape[2] > 1:  # (8,1,1) is pure data parallel: replicated.
    shd.check_sharded(model, mesh, min_size=2 ** 10)
  tokens, attn, loss_mask = reference["batch"]
  (loss, logits), grads = _logits_and_grads(model, tokens, attn, loss_mask,
                                            mesh)
  # The logits really are laid out over the mesh (batch over data x fsdp,
  # vocab over tensor) and not gathered onto one device.
  assert len(logits.sharding.device_set) == 8
  assert not logits.sharding.is_fully_replicated
  np.testing.assert_allclose(np.asarray(logits), reference["logits"],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(float(loss), float(reference["loss"]), rtol=1e-5)
  want = jax.tree_util.tree_flatten_with_path(reference["grads"])[0]
  got = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(grads))[0]
  assert [p for p, _ in want] == [p for p, _ in got]
  for (path, w), (_, g) in zip(want, got):
    scale = float(np.abs(w).max()) + 1e-12
    np.testing.assert_allclose(np.asarray(g) / scale, np.asarray(w) / scale,
                               atol=2e-5, err_msg=jax.tree_util.keystr(path))


# Expected specs from DEFAULT_RULES, by hand: embed -> fsdp, heads / kv_heads /
# mlp / vocab -> tensor, head_dim / norm -> replicated; an axis of size 1 is
# dropped.
def _expected(shape):
  _, fsdp, tensor = shape
  f = "fsdp" if fsdp > 1 else None
  t = "tensor" if tensor > 1 else None
  return {
      "embed_tokens": P(t, f),
      "q_proj": P(f, t, None), "k_proj": P(f, t, None), "v_proj": P(f, t, None),
      "o_proj": P(t, None, f),
      "gate_proj": P(f, t), "up_proj": P(f, t), "down_proj": P(t, f),
      "attn_norm": P(None), "q_norm": P(None),
  }


def _spec(arr):
  spec = tuple(arr.sharding.spec)
  return P(*(spec + (None,) * (arr.ndim - len(spec))))


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 2, 4), (1, 8, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_parameter_shardings_follow_rules_and_split_the_bytes(shape):
  mesh = _mesh(shape)
  model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))
  shd.shard_model(model, mesh)
  state = nnx.state(model)
  layer = state["layers"][0]
  arrays = {"embed_tokens": state["embed_tokens"][...]}
  arrays.update({k: layer[k][...] for k in _expected(shape) if k in layer})
  for name, spec in _expected(shape).items():
    arr = arrays[name]
    assert _spec(arr) == spec, (name, arr.sharding.spec)
  # q_proj [D=64, N=8, H=16]: each device holds D/fsdp x N/tensor x H.
  _, fsdp, tensor = shape
  q = arrays["q_proj"]
  for s in q.addressable_shards:
    assert s.data.shape == (64 // fsdp, 8 // tensor, 16)
  # Bytes on one device: every parameter except the (replicated) norms is
  # split fsdp * tensor ways.
  per_dev = {}
  for leaf in jax.tree.leaves(state):
    for s in leaf.addressable_shards:
      per_dev[s.device] = per_dev.get(s.device, 0) + s.data.nbytes
  total = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
  norms = sum(leaf.nbytes for leaf in jax.tree.leaves(state) if leaf.ndim == 1)
  want = (total - norms) / (fsdp * tensor) + norms
  assert set(per_dev.values()) == {want}
  assert shd.check_sharded(state, mesh, min_size=2 ** 10) == []


def test_check_sharded_flags_replicated_large_params():
  mesh = _mesh((2, 2, 2))
  model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))
  state = jax.device_put(nnx.state(model), NamedSharding(mesh, P()))
  bad = shd.check_sharded(state, mesh, min_size=2 ** 10, raise_error=False)
  assert any("q_proj" in b for b in bad) and any("embed" in b for b in bad)
  with pytest.raises(ValueError, match="replicated"):
    shd.check_sharded(state, mesh, min_size=2 ** 10)


def test_kv_heads_that_do_not_divide_tensor_stay_replicated_on_that_axis():
  # The tiny preset has 2 kv heads: on a 4-way tensor axis k_proj keeps its
  # fsdp split of the embed dim but its kv-head dim is not split.
  cfg = qwen3.Qwen3Config.preset("tiny")
  mesh = _mesh((1, 2, 4))
  model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  shd.shard_model(model, mesh)
  k = nnx.state(model)["layers"][0]["k_proj"][...]
  assert _spec(k) == P("fsdp", None, None)
  q = nnx.state(model)["layers"][0]["q_proj"][...]
  assert _spec(q) == P("fsdp", "tensor", None)


def test_strict_param_shardings_refuse_an_axis_that_does_not_divide():
  # The same layout as above, strictly: 2 kv heads on a 4-way tensor axis is
  # refused with the parameter and the rule named; replicating kv_heads
  # ("" in the rules) is accepted and leaves k_proj split over fsdp only.
  cfg = qwen3.Qwen3Config.preset("tiny")
  mesh = _mesh((1, 2, 4))
  _, abstract = nnx.split(nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))))
  with pytest.raises(shd.ShardingError, match=r"k_proj.*'kv_heads' \(size 2\) does not "
                     r"divide over mesh axis 'tensor' \(4-way\)"):
    shd.param_shardings(abstract, mesh, None, strict=True)
  rules = dict(shd.DEFAULT_RULES, kv_heads="")
  sh = shd.param_shardings(abstract, mesh, rules, strict=True)
  assert sh["layers"][0]["k_proj"].get_value().spec == P("fsdp", None, None)
  assert dict(shd.as_rules(rules))["kv_heads"] is None
  assert dict(shd.as_rules({"batch": "data,fsdp"}))["batch"] == ("data", "fsdp")


def test_trainer_refuses_bad_rules_and_replicated_params():
  """The config's rules reach the trainer; it names what does not fit."""
  cfg = qwen3.Qwen3Config.preset("tiny")
  config = config_utils.train_defaults()
  mesh = _mesh((1, 2, 4))
  with pytest.raises(config_utils.ConfigError, match="sharding: mesh .*k_proj"):
    state_lib.abstract_model(cfg, mesh, specs.run_spec(config).rules)
  config.sharding.rules.kv_heads = ""
  _, _, sh = state_lib.abstract_model(cfg, mesh, specs.run_spec(config).rules)
  assert sh["layers"][0]["k_proj"].get_value().spec == P("fsdp", None, None)
  # Everything replicated on a mesh with model-parallel axes: refused; under
  # pure data parallelism replicas are the design.
  model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  replicated = jax.device_put(nnx.state(model), NamedSharding(mesh, P()))
  config.sharding.min_sharded_size = 2 ** 10
  with pytest.raises(config_utils.ConfigError, match="large parameters are replicated"):
    shd.check_sharded(replicated, mesh, config.sharding.min_sharded_size)
  dp = _mesh((8, 1, 1))
  assert shd.check_sharded(jax.device_put(nnx.state(model), NamedSharding(dp, P())),
                           dp, config.sharding.min_sharded_size) == []


@pytest.mark.parametrize("shape,why", [
    ({"data": 3, "fsdp": -1}, "cannot fill -1"),
    ({"data": -1, "fsdp": -1}, "at most one mesh axis"),
    ({"model": 2}, "unknown mesh axes"),
    ({"data": 2, "fsdp": 2}, "needs 4 devices, have 8"),
])
def test_a_bad_mesh_is_a_one_line_config_error(shape, why):
  # The entry points print a ConfigError as one line; a mesh that does not
  # fit the devices is one, raised by sharding itself (no wrapper).
  with pytest.raises(config_utils.ConfigError, match=f"^mesh: .*{why}") as e:
    shd.make_mesh(shape)
  assert "\n" not in str(e.value)
