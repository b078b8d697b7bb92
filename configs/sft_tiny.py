"""A tiny SFT run on synthetic copy-task data: the CPU test config.

Run (about half a minute on a laptop CPU)::

  python -m paraagent_jax.train --config=configs/sft_tiny.py --workdir=/tmp/sft_tiny
  python -m paraagent_jax.train --config=configs/sft_tiny.py:total_steps=200,mesh.fsdp=2 \
      --workdir=/tmp/sft_tiny2

Every key of the returned config can be overridden after the colon
(``key=value,nested.key=value``); ``runlocal`` shrinks it further.
"""

from paraagent_jax import config_utils


def get_config(arg=None):
  """The tiny SFT config; ``arg`` is ``key=value,...``."""
  a = config_utils.parse_arg(arg, runlocal=False)
  c = config_utils.train_defaults()
  c.stage = "sft"
  c.runlocal = a.runlocal
  c.model.preset = "tiny"
  c.model.vocab_size = 64
  c.data.source = "synthetic"
  c.data.vocab_size = 64
  c.data.max_len = 12
  c.batch_size = 8
  c.seq_len = 32
  c.total_steps = 40
  c.optimizer.learning_rate = 3e-3
  c.optimizer.warmup_steps = 4
  c.log_every = 5
  c.eval_every = 20
  c.ckpt_every = 10
  c.keep_ckpts = 3
  if a.runlocal:
    c.total_steps = 8
    c.log_every = 2
    c.eval_every = 4
    c.ckpt_every = 4
  return c
