"""Policies behind one interface: our JAX model, the scripted oracle, an API model.

A rollout talks to a policy one turn at a time. For every episode that must
act, it passes a `TurnRequest` with the context added since that episode last
acted (token ids, and the same as chat messages for text-level policies); the
policy answers with a `TurnOutput`: the tokens it wrote, their log-probs, and
their text.

* `JaxPolicy` samples with `paraagent_jax.sampling.Sampler`, keeping one KV cache
  for the whole batch across turns: only the new context is prefilled.
* `OraclePolicy` replays `toolenv.oracle.solve(task, strategy)` rendered through
  the strategy's text format, so the whole text path (render, tokenise, parse)
  is exercised. Its log-probs are 0.
* `paraact.api_policy.APIPolicy` (its own module) asks an OpenAI-compatible
  endpoint through the ``openai`` SDK.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Sequence

import numpy as np

import toolenv
from paraagent_jax import sampling


@dataclasses.dataclass
class TurnRequest:
  """Context an episode received since its last turn, then a request to act."""
  episode: int
  new_ids: list[int]
  new_messages: list[dict[str, Any]]


@dataclasses.dataclass
class TurnOutput:
  """What a policy wrote in one turn."""
  token_ids: list[int]
  logprobs: list[float]
  text: str
  # Set by a policy that acts structurally (an API model's native tool
  # calls): the rollout runs this Step instead of parsing ``text``.
  step: toolenv.Step | None = None


class Policy(abc.ABC):
  """One turn at a time, for a batch of episodes."""

  name: str = "policy"

  @abc.abstractmethod
  def reset(self, num_episodes: int, tasks: Sequence[Any], seed: int = 0) -> None:
    """Starts a new batch of episodes (one task per episode)."""

  @abc.abstractmethod
  def act(self, requests: Sequence[TurnRequest]) -> list[TurnOutput]:
    """Returns one output per request, in order."""

  def stats(self) -> dict[str, float]:
    """Counters for the rollout report (e.g. tokens prefilled and decoded)."""
    return {}

  def release(self) -> None:
    """Frees per-batch device memory (a KV cache) once a rollout is done."""


class JaxPolicy(Policy):
  """Samples from a Flax model with a batch KV cache kept across turns.

  ``rows`` (attribute, default None): ``(offset, total)`` when this policy's
  episodes are rows ``offset ..`` of a batch of ``total`` episodes that
  several hosts sample together from one seed (an RL rollout split over a
  pod's hosts): each episode then draws the random numbers it draws in the
  whole batch on one host (`Sampler.generate`'s ``rows``).
  """

  name = "jax"

  def __init__(self, model, fmt, *, max_len: int, max_turn_tokens: int = 256,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               min_chunk: int = 32, max_chunk: int = 512, draw: str = "gumbel"):
    self._sampling = sampling
    self.draw = draw
    self.model = model
    self.fmt = fmt
    self.max_len = max_len
    self.max_turn_tokens = max_turn_tokens
    self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
    self.min_chunk, self.max_chunk = min_chunk, max_chunk
    self._sampler = None
    self._state = None
    self._stats = {}
    self._num = 0
    self.rows: tuple[int, int] | None = None

  def update_model(self, model) -> None:
    """Samples from new weights from the next reset on (RL: current parameters)."""
    self.model = model
    if self._sampler is not None:
      self._sampler.update_params(model)

  def reset(self, num_episodes, tasks, seed=0):
    del tasks
    if self._sampler is None or self._sampler.batch_size != num_episodes:
      self._sampler = self._sampling.Sampler(
          self.model, num_episodes, self.max_len, min_chunk=self.min_chunk,
          max_chunk=self.max_chunk)
    self._num = num_episodes
    self._state = self._sampler.init_state(seed)

  def act(self, requests):
    rows: list[list[int]] = [[] for _ in range(self._num)]
    active = np.zeros(self._num, bool)
    for r in requests:
      rows[r.episode] = list(r.new_ids)
      active[r.episode] = True
    self._state = self._sampler.append(self._state, rows)
    out = self._sampler.generate(
        self._state, self.max_turn_tokens, temperature=self.temperature,
        top_k=self.top_k, top_p=self.top_p,
        stop_sequences=self.fmt.stop_sequences, active=active,
        pad_token_id=self.fmt.pad_id, draw=self.draw, rows=self.rows)
    self._state = out.state
    results = []
    for r in requests:
      n = int(out.lengths[r.episode])
      ids = [int(t) for t in out.tokens[r.episode, :n]]
      results.append(TurnOutput(ids, [float(x) for x in out.logprobs[r.episode, :n]],
                                self.fmt.decode(ids)))
    return results

  def remaining(self, episode: int) -> int:
    """Free cache slots of an episode (the rollout truncates before overflow)."""
    return self.max_len - int(self._state.lengths[episode])

  def stats(self):
    return self._state.stats.as_dict() if self._state is not None else self._stats

  def release(self):
    """Drops the KV cache (the RL step then runs without it on device)."""
    if self._state is not None:
      self._stats = self._state.stats.as_dict()
      self._state = None


class OraclePolicy(Policy):
  """Replays the scripted oracle's steps through the text protocol."""

  name = "oracle"

  def __init__(self, fmt, strategy: str = "paraact"):
    self.fmt = fmt
    self.strategy = strategy
    self._plans: list[list[toolenv.Step]] = []
    self._turn: list[int] = []

  def reset(self, num_episodes, tasks, seed=0):
    del seed
    self._plans = [toolenv.oracle.solve(t, strategy=self.strategy) for t in tasks]
    self._turn = [0] * num_episodes

  def act(self, requests):
    results = []
    for r in requests:
      plan = self._plans[r.episode]
      i = self._turn[r.episode]
      self._turn[r.episode] += 1
      step = plan[i] if i < len(plan) else toolenv.Step(phase="answer", answer="")
      text = self.fmt.render(step)
      ids = self.fmt.encode(text)
      # No ``step``: the rollout parses the text, as it parses a model's.
      results.append(TurnOutput(ids, [0.0] * len(ids), text))
    return results
