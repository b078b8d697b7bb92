"""The jitted train step shared by SFT and GRPO: shardings, micro-batching, update.

Both the SFT cross-entropy step (`paraagent_jax.learner.sft_loss`) and the GRPO
step (`paraagent_jax.learner.grpo`) are built here, so they differ only in their
loss. A loss is given as a `LossFns` triple:

* ``prepare(batch) -> (inputs, metrics)`` runs once on the *whole* batch,
  outside the gradient: everything whose normalisation spans the batch
  (group-normalised advantages, the token-mean denominator) is computed here,
  so that accumulating micro-batch gradients gives exactly the full-batch
  gradient. ``inputs`` is a pytree of [B, ...] arrays.
* ``micro_loss(model, inputs_mb, ref_model) -> (loss, sums)``: the loss of
  one micro-batch, already weighted so that the sum over micro-batches is the
  full-batch loss; ``sums`` are additive metric numerators (those named
  ``max_*`` are maxima: `accumulate`).
* ``finalize(sums, metrics) -> metrics``: turns the summed numerators into
  metrics.

The model is an NNX module split as ``graphdef, state = nnx.split(model)``;
any module with ``model(tokens, attention_mask=...) -> logits [B,T,V]``
works. Only `nnx.Param` leaves are trained; other variables pass through.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax

from paraagent_jax import multihost
from paraagent_jax import sharding as shd
from paraagent_jax.learner import batch as batch_lib

DEFAULT_BATCH_AXES = ("data", "fsdp")


def split_params(state: nnx.State) -> tuple[nnx.State, nnx.State]:
  """(trainable Params, everything else) of a model state."""
  return nnx.split_state(state, nnx.Param, ...)


def state_sharding(state: nnx.State, mesh: jax.sharding.Mesh, rules=None):
  """NamedShardings from the logical axis names of an NNX state's variables
  (`paraagent_jax.sharding.param_shardings`; ``rules=None``: the defaults)."""
  return shd.param_shardings(state, mesh, rules)


def opt_state_sharding(optimizer: optax.GradientTransformation, params,
                       params_sharding, mesh: jax.sharding.Mesh):
  """Shardings of ``optimizer.init(params)``: moments follow their params."""
  shapes = jax.eval_shape(optimizer.init, params)
  replicated = NamedSharding(mesh, P())
  return optax.tree_map_params(
      optimizer, lambda _, s: s, shapes, params_sharding,
      transform_non_params=lambda _: replicated,
      is_leaf=lambda x: isinstance(x, NamedSharding))


def shard_train_state(state: nnx.State, optimizer: optax.GradientTransformation,
                      mesh: jax.sharding.Mesh,
                      rules: Mapping[str, Any] | None = None):
  """Places a model state on the mesh and creates its optimizer state there.

  Returns:
    (state, opt_state), both laid out with explicit NamedShardings.
  """
  sharding = state_sharding(state, mesh, rules)
  state = jax.device_put(state, sharding)
  params, _ = split_params(state)
  params_sharding, _ = split_params(sharding)
  opt_sharding = opt_state_sharding(optimizer, params, params_sharding, mesh)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_sharding)(params)
  return state, opt_state


def data_sharding(tree, mesh: jax.sharding.Mesh,
                  batch_axes: Sequence[str] = DEFAULT_BATCH_AXES):
  """Shards the leading (batch) axis of every leaf over ``batch_axes``."""
  axes = tuple(a for a in batch_axes if a in mesh.axis_names)
  return jax.tree.map(lambda _: NamedSharding(mesh, P(axes or None)), tree)


class LossFns(NamedTuple):
  """A loss in the three parts described in the module docstring."""

  prepare: Callable[[Any], tuple[Any, dict]]
  micro_loss: Callable[[Any, Any, Any], tuple[jax.Array, dict]]
  finalize: Callable[[dict, dict], dict]


def accumulate(acc, out):
  """Adds one micro-batch's ``((loss, sums), grads)`` to the running total.

  Sums are additive numerators, except those named ``max_*``, which keep the
  maximum (e.g. the largest sampler/trainer log-prob gap of the batch).
  """
  (loss_a, sums_a), grads_a = acc
  (loss_b, sums_b), grads_b = out
  sums = {k: (jnp.maximum(v, sums_b[k]) if k.startswith("max_") else v + sums_b[k])
          for k, v in sums_a.items()}
  return (loss_a + loss_b, sums), jax.tree.map(jnp.add, grads_a, grads_b)


def apply_gradients(optimizer: optax.GradientTransformation, loss_fns: LossFns, state,
                    opt_state, grads, loss, sums, metrics):
  """The optimizer update from summed micro-batch gradients, and the step's
  metrics (``finalize`` of the sums, ``loss``, ``grad_norm``)."""
  params, rest = split_params(state)
  metrics = dict(loss_fns.finalize(sums, metrics))
  metrics["loss"] = loss
  metrics["grad_norm"] = optax.tree.norm(grads)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  return nnx.merge_state(params, rest), opt_state, metrics


def carried_shardings(tree, mesh: jax.sharding.Mesh):
  """The NamedSharding each leaf of ``tree`` carries (arrays or abstract
  ShapeDtypeStructs); replicated over ``mesh`` for a leaf without one."""
  replicated = NamedSharding(mesh, P())
  return jax.tree.map(
      lambda x: x.sharding if isinstance(x.sharding, NamedSharding)
      else replicated, tree)


def _micro_grad_fn(model_graphdef, loss_fns: LossFns, ref_graphdef):
  """``grad_fn(params, rest, mb, ref_state) -> ((loss, sums), grads)``: one
  micro-batch's loss and its gradient in the trainable params (``rest``: the
  model's other variables; ``ref_state``: a frozen reference model, or None).
  """
  def loss_of(params, rest, mb, ref_state):
    ref_model = (None if ref_state is None
                 else nnx.merge(ref_graphdef or model_graphdef,
                                jax.lax.stop_gradient(ref_state)))
    return loss_fns.micro_loss(nnx.merge(model_graphdef, params, rest), mb,
                               ref_model)

  return jax.value_and_grad(loss_of, has_aux=True)


def build_train_step(model_graphdef, optimizer: optax.GradientTransformation,
                     loss_fns: LossFns, mesh: jax.sharding.Mesh, *,
                     num_micro_batches: int = 1,
                     batch_axes: Sequence[str] = DEFAULT_BATCH_AXES,
                     ref_graphdef=None):
  """A jitted, sharded, donating step ``(state, opt_state, batch, rng)``.

  Gradients of ``num_micro_batches`` micro-batches are summed in a
  `jax.lax.scan`, then one optimizer update is applied, all in one program.
  In/out shardings are the NamedShardings the state and optimizer state
  already carry (see `shard_train_state`); the batch is sharded over
  ``batch_axes`` (B, and B / num_micro_batches, must divide by the product
  of their sizes). The state and optimizer state are donated: do not reuse
  the arrays passed in. `build_sorted_train_step` is the same step with
  micro-batches of rows sorted by length.

  Returns:
    ``step_fn(state, opt_state, batch, rng, ref_state=None) ->
    (state, opt_state, metrics)``.
  """
  m = int(num_micro_batches)
  axes = tuple(a for a in batch_axes if a in mesh.axis_names) or None
  grad_fn = _micro_grad_fn(model_graphdef, loss_fns, ref_graphdef)

  def constrain_micro(x):
    return jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, P(None, axes)))

  def step(state, opt_state, batch, rng, ref_state):
    del rng  # Reserved for stochastic losses; the GRPO/SFT losses are not.
    params, rest = split_params(state)
    inputs, metrics = loss_fns.prepare(batch)
    if m == 1:
      (loss, sums), grads = grad_fn(params, rest, inputs, ref_state)
    else:
      micro = jax.tree.map(constrain_micro,
                           batch_lib.split_micro_batches(inputs, m))
      first = jax.tree.map(lambda x: x[0], micro)
      zero = jax.tree.map(jnp.zeros_like, jax.eval_shape(
          grad_fn, params, rest, first, ref_state))

      def body(acc, mb):
        return accumulate(acc, grad_fn(params, rest, mb, ref_state)), None

      ((loss, sums), grads), _ = jax.lax.scan(body, zero, micro)
    return apply_gradients(optimizer, loss_fns, state, opt_state, grads, loss, sums, metrics)

  replicated = NamedSharding(mesh, P())
  cache = {}

  def jitted(state, opt_state, batch, ref_state=None):
    """The jitted step for these arguments; abstract ones (ShapeDtypeStruct
    with shardings) work too, so ``jitted(...).lower(...)`` is a dry run."""
    # One compiled step per batch structure (e.g. with/without ref_logprobs).
    key = (ref_state is None, jax.tree.structure(batch))
    if key not in cache:
      in_sh = (carried_shardings(state, mesh), carried_shardings(opt_state, mesh),
               data_sharding(batch, mesh, batch_axes), replicated,
               None if ref_state is None else carried_shardings(ref_state, mesh))
      cache[key] = jax.jit(
          step, in_shardings=in_sh,
          out_shardings=(in_sh[0], in_sh[1], replicated),
          donate_argnums=(0, 1))
    return cache[key]

  def step_fn(state, opt_state, batch, rng, ref_state=None):
    return jitted(state, opt_state, batch, ref_state)(
        state, opt_state, batch, rng, ref_state)

  step_fn.jitted = jitted  # For `paraagent_jax.dry_run` (lowering only).
  return step_fn


def build_sorted_train_step(model_graphdef, optimizer: optax.GradientTransformation,
                            loss_fns: LossFns, mesh: jax.sharding.Mesh, *,
                            num_micro_batches: int, lengths: Sequence[int],
                            batch_axes: Sequence[str] = DEFAULT_BATCH_AXES,
                            ref_graphdef=None):
  """`build_train_step` with micro-batches of rows sorted by length.

  The one difference: RL batches hold whole episodes (a one-call task is a
  few hundred tokens, a mixed one fills ``max_len``), and the scan of
  `build_train_step` pays ``max_len`` for every row. Here the rows are
  sorted by ``batch.seq_len`` and cut into ``num_micro_batches``
  micro-batches on the host, each padded only to the smallest of
  ``lengths`` that holds its longest row. The rest is shared: ``prepare``
  runs jitted on the whole batch (group-normalised advantages, the
  token-mean denominator), each micro-batch's gradient is the same
  `_micro_grad_fn` (a program compiled once per length), and one jitted,
  donating update (`apply_gradients`) applies their sum: the same update as
  `build_train_step`, up to float summation order.

  Every leaf of ``prepare``'s inputs must be ``[B, T, ...]`` (true of the
  GRPO and SFT losses); ``lengths`` should include T.

  Returns:
    ``step_fn(state, opt_state, batch, rng, ref_state=None) ->
    (state, opt_state, metrics)``; ``metrics["padded_tokens"]`` is the rows x
    length the micro-batches computed.
  """
  m = int(num_micro_batches)
  lengths = sorted({int(x) for x in lengths if int(x) > 0})
  grad_fn = _micro_grad_fn(model_graphdef, loss_fns, ref_graphdef)

  def micro_grad(params, rest, mb, ref_state, acc):
    return accumulate(acc, grad_fn(params, rest, mb, ref_state))

  def update(state, opt_state, grads, loss, sums, metrics):
    return apply_gradients(optimizer, loss_fns, state, opt_state, grads, loss, sums, metrics)

  jit_prepare = jax.jit(loss_fns.prepare)
  jit_grad = {}
  jit_update = {}
  jit_take = {}

  def take(length):
    """Jitted ``(inputs, rows) -> inputs[rows, :length]``, laid out over the
    batch axes: one program, not eager indexing of (possibly multi-host)
    global arrays, which deadlocked two CPU processes (`local_pod`)."""
    if length not in jit_take:
      jit_take[length] = jax.jit(
          lambda inputs, idx: jax.tree.map(lambda x: x[idx, :length], inputs),
          out_shardings=data_sharding(0, mesh, batch_axes))
    return jit_take[length]

  def step_fn(state, opt_state, batch, rng, ref_state=None):
    del rng  # As in build_train_step.
    # The lengths on the host (gathered from every host's rows when the batch
    # is a global array spanning several processes: all of them sort alike).
    seq_len = multihost.host_value(batch.seq_len)
    b = seq_len.shape[0]
    if b % m:
      raise ValueError(f"batch size {b} is not divisible by num_micro_batches={m}")
    inputs, metrics = jit_prepare(batch)
    t = batch.tokens.shape[1]
    order = np.argsort(seq_len, kind="stable")
    params, rest = split_params(state)
    key = ref_state is None
    if key not in jit_grad:
      jit_grad[key] = jax.jit(micro_grad, donate_argnums=(4,))
    acc, rows = None, b // m
    padded = 0
    for k in range(m):
      longest = int(seq_len[order[(k + 1) * rows - 1]])
      length = next((x for x in lengths if longest <= x <= t), t)
      mb = take(length)(inputs, order[k * rows:(k + 1) * rows].astype(np.int32))
      if acc is None:   # Zeros of (loss, sums), grads: one compiled add per length.
        acc = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                           jax.eval_shape(grad_fn, params, rest, mb, ref_state))
      acc = jit_grad[key](params, rest, mb, ref_state, acc)
      padded += rows * length
    (loss, sums), grads = acc
    if "fn" not in jit_update:
      jit_update["fn"] = jax.jit(
          update, out_shardings=(carried_shardings(state, mesh),
                                 carried_shardings(opt_state, mesh),
                                 NamedSharding(mesh, P())),
          donate_argnums=(0, 1))
    state, opt_state, metrics = jit_update["fn"](state, opt_state, grads, loss, sums, metrics)
    metrics = dict(metrics)
    metrics["padded_tokens"] = float(padded)
    return state, opt_state, metrics

  return step_fn


def build_eval_step(model_graphdef, loss_fns: LossFns,
                    mesh: jax.sharding.Mesh, *,
                    batch_axes: Sequence[str] = DEFAULT_BATCH_AXES):
  """A jitted loss-and-metrics evaluation (no gradient, no update).

  Returns:
    ``eval_fn(state, batch) -> metrics`` (``loss`` included).
  """
  replicated = NamedSharding(mesh, P())

  def evaluate(state, batch):
    inputs, metrics = loss_fns.prepare(batch)
    loss, sums = loss_fns.micro_loss(nnx.merge(model_graphdef, state),
                                     inputs, None)
    metrics = dict(loss_fns.finalize(sums, metrics))
    metrics["loss"] = loss
    return metrics

  cache = {}

  def eval_fn(state, batch):
    key = jax.tree.structure(batch)
    if key not in cache:
      in_sh = (carried_shardings(state, mesh),
               data_sharding(batch, mesh, batch_axes))
      cache[key] = jax.jit(evaluate, in_shardings=in_sh,
                           out_shardings=replicated)
    return cache[key](state, batch)

  return eval_fn
