r"""Which functions read the config while the RL stage runs (issue 46's measure).

Runs a tiny RL stage (a random 2-layer model, 1 iteration of 4 tasks x 2
samples, held-out evaluation before and after, on a BPE trained here) under
`paraagent_jax.config_reads.config_reads` and prints every function of
``paraagent_jax/`` that read a ConfigDict, with its read count. Since the
typed stage specs, only the door reads it: ``trainer/specs.py``,
``rundir.model_spec`` / ``tokenizer_dir`` and ``config_utils``'s mapping
helper; ``tests/trainer/test_rl_stage.py`` asserts as much.

    python scripts/config_readers.py [--workdir=/tmp/readers]

About a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  pylint: disable=wrong-import-position

import toolenv  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import config_reads  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import config_utils  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import tokenizer as tok_lib  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.paraact import protocol  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.trainer import rl as rl_lib  # noqa: E402  pylint: disable=wrong-import-position


def tiny_rl_config(tokenizer: str):
  """configs/sft_tiny.py as a 1-iteration RL stage on ``tokenizer``."""
  c = config_utils.load_config("configs/sft_tiny.py")
  c.stage, c.model.vocab_size, c.progress, c.tensorboard = "rl", 0, False, False
  for k, v in dict(tokenizer=tokenizer, iterations=1, tasks_per_iter=4, group_size=2,
                   max_turns=2, max_turn_tokens=12, max_len=768, max_obs_tokens=64,
                   eval_tasks=2, eval_every=1).items():
    c.rl[k] = v
  return c


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  ap.add_argument("--workdir", default="", help="where the run goes (default: a temp dir)")
  a = ap.parse_args(argv)
  jax.config.update("jax_num_cpu_devices", 8)
  d = a.workdir or tempfile.mkdtemp()
  tasks = toolenv.TaskGenerator(toolenv.load_catalog("procedural", seed=0),
                                seed=0).generate(40, split="train")
  texts = [protocol.system_prompt()] + [t.instruction for t in tasks]
  texts += [protocol.render_step(s) for t in tasks for s in toolenv.oracle.solve(t)]
  tok_lib.train_bpe_tokenizer(texts, vocab_size=700, out_dir=os.path.join(d, "tok"))
  config = tiny_rl_config(os.path.join(d, "tok"))
  with config_reads.config_reads(os.path.join(ROOT, "paraagent_jax")) as readers:
    rl_lib.run_rl(config, os.path.join(d, "rl"))
  files = {r.split(":")[0] for r in readers}
  print(f"\n{len(readers)} functions in {len(files)} files of paraagent_jax/ read the config:")
  for name, n in sorted(readers.items()):
    print(f"  {name:55} {n:4d} reads")
  return 0


if __name__ == "__main__":
  sys.exit(main())
