"""Tests of the Orbax checkpointer: round trip on a mesh, keep-K, corruption."""

import json
import os

from flax import nnx
import jax
import numpy as np
import optax
import pytest

from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import checksums
from paraagent_jax import sharding as shd


def make_state(mesh, seed=0):
  model = nnx.Linear(8, 4, rngs=nnx.Rngs(seed))
  _, state = nnx.split(model)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
  params = nnx.split_state(state, nnx.Param, ...)[0]
  opt_state = opt.init(params)
  # Shard the kernel's rows over fsdp so the round trip crosses devices.
  sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  place = lambda x: jax.device_put(x, rows if x.ndim == 2 else sh)
  return jax.tree.map(place, state), jax.tree.map(place, opt_state)


def abstract_of(tree):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      tree)


@pytest.fixture
def mesh():
  return shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})


def assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_keeps_values_shardings_data_and_rng(tmp_path, mesh):
  state, opt_state = make_state(mesh)
  key = jax.random.key(7)
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=2, keep=2)
  assert not c.save(1, state, opt_state, data_state={"next_batch": 1},
                    rng=key)  # Not a save step.
  assert c.save(2, state, opt_state, data_state={"next_batch": 2}, rng=key,
                extra={"note": "x"})
  c.close()
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=2, keep=2)
  r = c.restore(abstract_of(state), abstract_of(opt_state))
  assert r.step == 2 and r.data_state == {"next_batch": 2}
  assert r.extra == {"note": "x"} and r.path.endswith("checkpoints/2")
  assert_trees_equal(r.model_state, state)
  assert_trees_equal(r.opt_state, opt_state)
  assert r.model_state["kernel"][...].sharding.spec == (
      jax.sharding.PartitionSpec("fsdp"))
  assert jax.random.key_data(r.rng).tolist() == (
      jax.random.key_data(key).tolist())
  c.close()


def test_raw_uint32_keys_round_trip():
  key = jax.random.PRNGKey(3)
  back = ckpt_lib.rng_from_json(ckpt_lib.rng_to_json(key))
  np.testing.assert_array_equal(np.asarray(back), np.asarray(key))


def test_keeps_last_k_and_forced_final_save(tmp_path, mesh):
  state, opt_state = make_state(mesh)
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=3, keep=2)
  for step in range(1, 11):
    c.save(step, state, opt_state, data_state={}, rng=jax.random.PRNGKey(0),
           force=step == 10)
  c.wait()
  assert c.all_steps() == [6, 9, 10][-2:]
  assert c.last_complete().endswith("checkpoints/10")
  # Saving a step that exists is a no-op, not an error.
  assert not c.save(10, state, opt_state, data_state={},
                    rng=jax.random.PRNGKey(0), force=True)
  c.close()


def _corrupt(step_dir):
  for root, _, files in os.walk(os.path.join(step_dir, "model")):
    for f in files:
      with open(os.path.join(root, f), "wb") as fh:
        fh.write(b"garbage")


def test_corrupt_latest_falls_back_and_is_moved_aside(tmp_path, mesh, capsys):
  state, opt_state = make_state(mesh)
  other, other_opt = make_state(mesh, seed=1)
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=1, keep=None)
  c.save(1, state, opt_state, data_state={"next_batch": 1},
         rng=jax.random.PRNGKey(0))
  c.save(2, other, other_opt, data_state={"next_batch": 2},
         rng=jax.random.PRNGKey(0))
  c.close()
  _corrupt(os.path.join(tmp_path, "checkpoints", "2"))
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=1, keep=None)
  r = c.restore(abstract_of(state), abstract_of(opt_state))
  assert r.step == 1 and r.data_state == {"next_batch": 1}
  assert_trees_equal(r.model_state, state)
  assert "step 2 unreadable" in capsys.readouterr().out
  assert os.path.isdir(os.path.join(tmp_path, "checkpoints", "corrupt-2"))
  assert c.all_steps() == [1]
  # Training can go on and save step 2 again.
  assert c.save(2, state, opt_state, data_state={}, rng=jax.random.PRNGKey(0))
  c.close()


def _truncate_largest(step_dir):
  """Cuts the largest data file of ``step_dir/model`` to half its size."""
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "model"))
           for f in fs]
  target = max(files, key=os.path.getsize)
  size = os.path.getsize(target)
  with open(target, "r+b") as fh:
    fh.truncate(size // 2)
  return os.path.relpath(target, step_dir)


def test_finished_steps_are_sealed_and_a_truncated_file_is_named(tmp_path, mesh, capsys):
  state, opt_state = make_state(mesh)
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=1, keep=None)
  for step in (1, 2):
    c.save(step, state, opt_state, data_state={"next_batch": step},
           rng=jax.random.PRNGKey(0))
  c.close()
  step2 = os.path.join(tmp_path, "checkpoints", "2")
  for step_dir in (os.path.join(tmp_path, "checkpoints", "1"), step2):
    manifest = json.load(open(os.path.join(step_dir, checksums.TREE_MANIFEST)))
    # Every file Orbax wrote is listed with its size and hash.
    on_disk = {os.path.relpath(os.path.join(r, f), step_dir)
               for r, _, fs in os.walk(step_dir) for f in fs} - {checksums.TREE_MANIFEST}
    assert set(manifest["files"]) == on_disk
    assert all("sha256" in v for v in manifest["files"].values())
  name = _truncate_largest(step2)
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=1, keep=None)
  r = c.restore(abstract_of(state), abstract_of(opt_state))
  assert r.step == 1 and r.data_state == {"next_batch": 1}
  out = capsys.readouterr().out
  assert "step 2 unreadable" in out and name in out and "truncated" in out, out
  # Moved aside, not deleted.
  assert os.path.isfile(os.path.join(tmp_path, "checkpoints", "corrupt-2", name))
  c.close()


def test_a_rewritten_file_of_the_same_size_is_caught_by_its_hash(tmp_path, mesh):
  state, opt_state = make_state(mesh)
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=1)
  c.save(1, state, opt_state, data_state={}, rng=jax.random.PRNGKey(0))
  c.close()
  step1 = os.path.join(tmp_path, "checkpoints", "1")
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step1, "model"))
           for f in fs]
  target = max(files, key=os.path.getsize)
  data = bytearray(open(target, "rb").read())
  data[len(data) // 2] ^= 0xFF
  open(target, "wb").write(bytes(data))
  # Weights only (evaluate, export, init_from): one line naming step and file.
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    ckpt_lib.restore_model_state(str(tmp_path), abstract_of(state))
  msg = str(e.value)
  assert "\n" not in msg and "step 1" in msg and os.path.relpath(target, step1) in msg
  assert "differs from what was saved" in msg


def test_no_readable_checkpoint_is_a_one_line_error(tmp_path, mesh):
  state, opt_state = make_state(mesh)
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=1)
  c.save(1, state, opt_state, data_state={}, rng=jax.random.PRNGKey(0))
  c.close()
  _corrupt(os.path.join(tmp_path, "checkpoints", "1"))
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=1)
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    c.restore(abstract_of(state), abstract_of(opt_state))
  assert "no readable checkpoint" in str(e.value) and "\n" not in str(e.value)
  # The unreadable step is left in place for the user to inspect.
  assert c.all_steps() == [1]
  c.close()


def test_empty_workdir_and_interrupted_save_mean_no_checkpoint(tmp_path, mesh):
  state, opt_state = make_state(mesh)
  # What an interrupted save leaves behind: a temporary directory only.
  os.makedirs(tmp_path / "checkpoints" / "5.orbax-checkpoint-tmp" / "model")
  c = ckpt_lib.Checkpointer(str(tmp_path), every_steps=1)
  assert c.latest_step() is None
  assert c.restore(abstract_of(state), abstract_of(opt_state)) is None
  c.close()


def test_init_from_model_weights(tmp_path, mesh):
  state, opt_state = make_state(mesh)
  c = ckpt_lib.Checkpointer(str(tmp_path / "run"), every_steps=1)
  c.save(3, state, opt_state, data_state={}, rng=jax.random.PRNGKey(0))
  c.close()
  for path in (tmp_path / "run", tmp_path / "run" / "checkpoints",
               tmp_path / "run" / "checkpoints" / "3"):
    assert ckpt_lib.find_checkpoint(str(path))[1] == 3
    got = ckpt_lib.restore_model_state(str(path), abstract_of(state))
    assert_trees_equal(got, state)
  assert ckpt_lib.find_checkpoint(str(tmp_path)) is None
  with pytest.raises(ckpt_lib.CheckpointError, match="no Orbax checkpoint"):
    ckpt_lib.restore_model_state(str(tmp_path), abstract_of(state))


def test_pipeline_root_points_at_its_stage(tmp_path):
  """evaluate --checkpoint / export_hf --workdir at a pipeline's root name the
  stage directory that holds the model instead of failing on a tokenizer."""
  from paraagent_jax import config_utils, evaluate, export_hf  # pylint: disable=g-import-not-at-top
  root = tmp_path / "demo"
  os.makedirs(root / "demos")
  os.makedirs(root / "sft" / "checkpoints" / "40" / "model")
  assert "its model is in " + str(root / "sft") in ckpt_lib.pipeline_hint(str(root))
  os.makedirs(root / "rl" / "checkpoints" / "3" / "model")
  hint = ckpt_lib.pipeline_hint(str(root))
  assert "its model is in " + str(root / "rl") in hint
  # A run directory, a step directory and an empty directory get no hint.
  for path in (root / "rl", root / "rl" / "checkpoints" / "3", tmp_path / "none"):
    assert ckpt_lib.pipeline_hint(str(path)) == ""
  with pytest.raises(export_hf.ExportError, match="pipeline directory.*rl"):
    export_hf.export(str(root), str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out")
  cfg = config_utils.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))), "configs", "evaluate.py"))
  with pytest.raises(config_utils.ConfigError, match="pipeline directory.*rl"):
    evaluate.run(cfg, str(tmp_path / "eval"), checkpoint=str(root))
