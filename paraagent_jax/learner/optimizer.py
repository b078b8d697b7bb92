"""The optimizer: AdamW with warmup, a decay schedule and global-norm clipping.

`OptimizerConfig` is built from ``config.optimizer`` by
`config_utils.config_from_mapping`
(unknown keys rejected); `make_optimizer` returns the Optax transformation and
`make_schedule` its learning-rate schedule (logged by the trainer).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import optax

from paraagent_jax import config_utils

SCHEDULES = ("cosine", "linear", "constant", "wsd")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW with warmup, a decay schedule and global-norm clipping.

  Attributes:
    learning_rate: peak learning rate.
    warmup_steps: linear warmup from 0 to the peak.
    total_steps: length of the schedule (warmup included).
    schedule: "cosine", "linear" or "constant" after the warmup, or "wsd"
      (warmup-stable-decay: constant at the peak, then a linear decay to
      ``end_lr_ratio`` over the last ``decay_steps``). Under "constant" and
      "wsd" the first steps do not depend on ``total_steps``, so a longer
      run continues a shorter one exactly (up to its decay).
    end_lr_ratio: final learning rate as a fraction of the peak.
    decay_steps: "wsd" only: length of the final decay (0 = the last 20%).
    weight_decay: decoupled weight decay (not applied to vectors: norms,
      biases).
    b1: Adam beta1.
    b2: Adam beta2.
    adam_eps: Adam epsilon.
    max_grad_norm: global-norm clip (<= 0 disables it).
  """

  learning_rate: float = 1e-5
  warmup_steps: int = 10
  total_steps: int = 1000
  schedule: str = "cosine"
  end_lr_ratio: float = 0.1
  decay_steps: int = 0
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  adam_eps: float = 1e-8
  max_grad_norm: float = 1.0


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
  """Warmup then cosine / linear decay / constant / stable-then-decay schedule."""
  cfg = config_utils.config_from_mapping(OptimizerConfig, config)
  if cfg.schedule not in SCHEDULES:
    raise ValueError(f"schedule={cfg.schedule!r}; choose from {SCHEDULES}")
  peak, warm = cfg.learning_rate, max(int(cfg.warmup_steps), 0)
  decay = max(int(cfg.total_steps) - warm, 1)
  end = peak * cfg.end_lr_ratio
  if cfg.schedule == "cosine":
    after = optax.cosine_decay_schedule(peak, decay, alpha=cfg.end_lr_ratio)
  elif cfg.schedule == "linear":
    after = optax.linear_schedule(peak, end, decay)
  elif cfg.schedule == "wsd":
    tail = int(cfg.decay_steps) if cfg.decay_steps > 0 else max(decay // 5, 1)
    tail = min(tail, decay)
    after = optax.join_schedules(
        [optax.constant_schedule(peak), optax.linear_schedule(peak, end, tail)],
        [decay - tail])
  else:
    after = optax.constant_schedule(peak)
  if warm == 0:
    return after
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warm), after], [warm])


def make_optimizer(config: OptimizerConfig | Mapping[str, Any] | None = None
                   ) -> optax.GradientTransformation:
  """AdamW + warmup schedule + global-norm clipping (clip applied first)."""
  cfg = config_utils.config_from_mapping(OptimizerConfig, config)
  # Decay matrices only: decaying norm scales towards 0 hurts small models.
  decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
  adamw = optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2,
                      eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
                      mask=decay_mask)
  if cfg.max_grad_norm and cfg.max_grad_norm > 0:
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
  return adamw
