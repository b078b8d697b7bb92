"""The RL stage on several hosts: each rolls out and evaluates its share.

On a pod (or `paraagent_jax.local_pod` on this CPU) the learner's batch is one
global array sharded over the mesh's batch axes, and each process holds a
contiguous range of its rows. An RL iteration on P > 1 processes:

* every process draws the same tasks (the draw is a function of the
  iteration and the logged history, which every process keeps alike);
* each process rolls out the episodes of the rows it holds (`Hosts.rows`:
  whole GRPO groups, never split; else a one-line `ConfigError`) with its own
  `toolenv.VectorToolEnv` and a sampler over its *local* devices, on a local
  copy of the parameters (`Hosts.sampling_model`); the sampler draws for each
  row the random numbers it draws in the whole batch on one host (the policy's
  ``rows``, `paraagent_jax.sampling.programs.draw_rows`), so the episodes
  are those of a one-process run with the same seed, up to float rounding of
  the sharded forward passes;
* the learner's batch is assembled from the processes' rows
  (`trainer.state.device_batch`: ``jax.make_array_from_process_local_data``);
  the advantages are computed inside the jitted step over the global batch,
  so group statistics are those of one process;
* what the metrics read (the per-episode records without transcripts and
  the reward arrays) is gathered to every process (`gather_rollout`), so the
  logged history, and the task draw that reads it, stay alike everywhere.

The held-out evaluation splits its tasks the same way (`evaluate_share`;
greedy, so any split gives the same records) and gathers the per-task
records, in task order, to every process; process 0 writes them.

On one process nothing here runs: `trainer.rl` samples on the train
state's own (sharded) parameters as before.

What a real pod of large models would need, and this does not do: the local
copy of the parameters is gathered through the hosts' memory
(``process_allgather``) and laid out over the host's devices with the
run's rules (FSDP over them): right for the demo's and small models, too
slow and too big for billions of parameters. There the sampler would keep
its parameters sharded over each host's chips (tensor parallel within a
host, or a sampler mesh of its own) and receive each update by a jitted
device-to-device reshard from the trainer's layout, without leaving the
accelerators. The random draw is made for the whole batch on every host
(`draw_rows`), which a large batch and vocabulary make costly: a pod would key
each row by its global index instead (a different random stream from the
one-host runs recorded so far).
"""

from __future__ import annotations

from typing import Any, Sequence

from flax import nnx
import jax
import numpy as np

from paraagent_jax import config_utils
from paraagent_jax import multihost
from paraagent_jax import sharding as shd
from paraagent_jax.evaluation import heldout
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.learner import step as ts
from paraagent_jax.paraact import rollout
from paraagent_jax.trainer import state as state_lib

# The rollout arrays the iteration's metrics read (`trainer.rl.rollout_metrics`,
# `traj_spread_fraction`), gathered from every process.
METRIC_ARRAYS = ("traj_reward", "phase_reward", "phase_mask", "step_reward",
                 "step_mask", "seq_len")


def local_mesh(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
  """A mesh over this process's devices with the axes of ``mesh``: its
  ``tensor`` size where it divides the local device count, the rest ``fsdp``."""
  n = jax.local_device_count()
  tensor = mesh.shape.get("tensor", 1)
  tensor = tensor if n % tensor == 0 else 1
  return shd.make_mesh({"data": 1, "fsdp": n // tensor, "tensor": tensor},
                       jax.local_devices())


class Hosts:
  """This process's share of an RL run on several processes.

  Args:
    mesh: the learner's (global) mesh.
    model_config: the policy's `Qwen3Config`.
    rules: the run's logical-axis rules.
    num_groups, group_size: the rollout batch (tasks x samples per task).

  Raises:
    ConfigError: the rows this process holds split a GRPO group.
  """

  def __init__(self, mesh, model_config, rules, num_groups: int, group_size: int):
    self.index, self.count = jax.process_index(), jax.process_count()
    self.num_rows = num_groups * group_size
    sharding = ts.data_sharding(np.zeros(1), mesh)
    try:
      self.rows = multihost.process_rows(sharding, self.num_rows)
    except ValueError as e:
      raise config_utils.ConfigError(f"rl: {e}") from None
    if self.rows[0] % group_size or self.rows[1] % group_size:
      raise config_utils.ConfigError(
          f"rl: {num_groups} tasks x {group_size} samples on {self.count} processes: "
          f"process {self.index} holds rows {self.rows[0]}..{self.rows[1] - 1}, which "
          f"split a task's group (make rl.tasks_per_iter a multiple of the process count)")
    self.mesh = local_mesh(mesh)
    self.graphdef, _, self.shardings = state_lib.abstract_model(model_config, self.mesh,
                                                                rules)

  def sampling_model(self, state) -> nnx.Module:
    """The policy at the learner's ``state`` (a global array tree), copied to
    this process's devices (a collective: every process calls it)."""
    host = multihost.host_value_tree(state)
    return nnx.merge(self.graphdef, jax.device_put(host, self.shardings))

  def share(self, items: Sequence[Any]) -> list[Any]:
    """This process's rows of a per-row list of the whole batch."""
    return list(items[self.rows[0]:self.rows[1]])

  def episode_counts(self, parts: Sequence[dict]) -> dict[str, float]:
    """``rollout/episodes_process<i>``: episodes each process rolled out."""
    return {f"rollout/episodes_process{i}": float(p["episodes"]) for i, p in
            enumerate(parts)}


def _episode_lite(e: dict) -> dict:
  """An episode record without its transcript (what the metrics read)."""
  return {k: v for k, v in e.items() if k != "transcript"}


def gather_rollout(res: rollout.RolloutResult, start: int
                   ) -> tuple[rollout.RolloutResult, list[dict]]:
  """Every process's rollout, as one result in row order (its arrays only
  `METRIC_ARRAYS`, its episodes without transcripts, no buffers), on every
  process; and each process's part (``start``, ``episodes``, ``timing``)."""
  parts = multihost.allgather_json({
      "start": int(start), "episodes": len(res.episodes),
      "arrays": {k: np.asarray(res.arrays[k]).tolist() for k in METRIC_ARRAYS},
      "dtypes": {k: str(res.arrays[k].dtype) for k in METRIC_ARRAYS},
      "records": [_episode_lite(e) for e in res.episodes], "timing": res.timing})
  ordered = sorted(parts, key=lambda p: p["start"])
  arrays = {k: np.concatenate([np.asarray(p["arrays"][k], p["dtypes"][k])
                               for p in ordered]) for k in METRIC_ARRAYS}
  episodes = [e for p in ordered for e in p["records"]]
  return rollout.RolloutResult(arrays, episodes, [], res.timing, res.policy_stats), parts


def global_batch(res: rollout.RolloutResult, mesh, token_budget: int = 0
                 ) -> batch_lib.TrajectoryBatch:
  """The learner's batch: every process's rows of it, one global array each
  (groups beyond ``token_budget`` masked, `batch_lib.apply_token_budget`, in
  one jitted program: eager operations on multi-host arrays deadlocked)."""
  batch = batch_lib.TrajectoryBatch(**state_lib.device_batch(res.arrays, mesh))
  if token_budget:
    batch = jax.jit(lambda b: batch_lib.apply_token_budget(b, token_budget)[0],
                    out_shardings=ts.data_sharding(0, mesh))(batch)
  return batch


def evaluate_share(ho: heldout.HeldOut, policy, fmt) -> heldout.Evaluation:
  """`HeldOut.run` with the tasks split over the processes: each rolls out
  a contiguous share; the per-task records (`heldout.paired_record`'s
  fields) are gathered in task order, and summarised, on every process."""
  n = len(ho.tasks)
  lo, hi = n * jax.process_index() // jax.process_count(), n * (
      jax.process_index() + 1) // jax.process_count()
  records = []
  if hi > lo:
    mine = heldout.HeldOut(ho.spec, ho.catalog, ho.tasks[lo:hi])
    records = [heldout.paired_record(r) for r in mine.run(policy, fmt).records]
  records = [r for part in multihost.allgather_json(records) for r in part]
  return heldout.Evaluation(heldout.summarize(records), records)
