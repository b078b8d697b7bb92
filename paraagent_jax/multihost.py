"""Several JAX processes (the hosts of a pod): who writes, barriers, gathers.

A multi-host run is one program on every host (multi-controller JAX): every
process runs the same Python, every collective (a jitted computation over the
global mesh, `barrier`, `allgather_json`) must be reached by all processes in
the same order, and a global `jax.Array` can be read on a host only where it
holds the whole value (fully replicated) or after a gather (`host_value`).

On one process every function here is trivial and runs no collective, so a
single-process run does exactly what it did before these helpers existed.
`paraagent_jax.local_pod` rehearses N hosts on this CPU.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np


def is_primary() -> bool:
  """Whether this is process 0, the one that writes files shared by the run."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reached the barrier ``name`` (no-op on one
  process): what one process wrote is then visible to all."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def primary_first(name: str):
  """Runs the body on process 0, then on the others: what process 0 writes
  there (a built dataset, a trained tokenizer) the others then read. A
  barrier named ``name``; nothing on one process."""
  later = not is_primary()
  if later:
    barrier(name)
  yield
  if not later:
    barrier(name)


def allgather_json(obj: Any) -> list[Any]:
  """Every process's ``obj`` (JSON-serialisable), in process order, on every
  process; ``[obj]`` itself on one process (no copy, no round trip).

  Two collectives: the sizes, then the UTF-8 bytes padded to the longest.
  NumPy scalars are written as numbers; floats round-trip exactly.
  """
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(json.dumps(obj, default=_json_default).encode("utf-8"), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.int32(data.size))).reshape(-1)
  buf = np.zeros(max(1, int(sizes.max())), np.uint8)
  buf[:data.size] = data
  bufs = np.asarray(multihost_utils.process_allgather(buf))
  return [json.loads(bytes(bufs[i, :int(n)]).decode("utf-8")) for i, n in enumerate(sizes)]


def _json_default(o):
  if isinstance(o, (np.generic, np.ndarray)):
    return o.tolist()
  raise TypeError(f"not JSON-serialisable: {type(o).__name__}")


def any_process(flag: bool) -> bool:
  """True if ``flag`` is true on any process (the same answer on all): a
  decision every process must take together, such as stopping on a signal."""
  return any(allgather_json(bool(flag)))


def host_value(x) -> np.ndarray:
  """The whole value of ``x`` as numpy on this host: a global array that
  spans other processes' devices is gathered (a collective: every process
  must call this for the same array); anything else is just fetched."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def host_value_tree(tree):
  """`host_value` of every leaf of ``tree`` (e.g. a model state)."""
  return jax.tree.map(host_value, tree)


def process_rows(sharding: jax.sharding.Sharding, num_rows: int) -> tuple[int, int]:
  """``(start, stop)``: the rows of a ``[num_rows, ...]`` array laid out with
  ``sharding`` (sharded along its first axis) that this process's devices
  hold, one contiguous range.

  Raises:
    ValueError: this process holds no rows, or rows that are not contiguous.
  """
  index = sharding.addressable_devices_indices_map((int(num_rows),))
  held = set()
  for idx in index.values():
    held.update(range(*idx[0].indices(int(num_rows))))
  if not held:
    raise ValueError(f"process {jax.process_index()} holds none of {num_rows} rows")
  start, stop = min(held), max(held) + 1
  if len(held) != stop - start:
    raise ValueError(f"process {jax.process_index()} holds rows that are not "
                     f"contiguous: {sorted(held)}")
  return start, stop
