"""The embedded demo: demonstrations -> SFT -> RL of a tiny Qwen3 on this CPU.

The model is trained from scratch; tasks come from ToolEnv's procedural
catalog and the SFT data are the scripted multi-agent demonstrations
(`paraagent_jax.coldstart`), linearised into ParaAct trajectories.

Run::

  python -m paraagent_jax.train --config=configs/demo.py --workdir=/tmp/demo
  python -m paraagent_jax.train --config=configs/demo.py:stage=sft --workdir=/tmp/x
  python -m paraagent_jax.train --config=configs/demo.py:runlocal --workdir=/tmp/y

``stage`` is "pipeline" (all three stages in WORKDIR/demos, WORKDIR/sft,
WORKDIR/rl), "sft" or "rl". ``size`` picks the model preset ("demo" or
"tiny"); ``runlocal`` shrinks everything to a one-minute smoke run.
"""

from paraagent_jax import config_utils


def get_config(arg=None):
  """The demo config; ``arg`` is ``key=value,...``."""
  a = config_utils.parse_arg(arg, stage="pipeline", size="demo",
                             runlocal=False)
  c = config_utils.train_defaults()
  c.stage = a.stage
  c.size = a.size
  c.runlocal = a.runlocal
  c.model.preset = a.size
  c.model.vocab_size = 0            # from the trained tokenizer

  # Demonstrations (stage "demos" and the SFT data source).
  c.data.source = "demonstrations"
  c.data.catalog = "procedural"
  c.data.backend = "scripted"
  c.data.num_tasks = 4000
  c.data.data_dir = ""              # "" = WORKDIR/demos (pipeline) or built
  c.data.tokenizer = ""             # "" = train the demo BPE
  c.batch_size = 16
  # Demonstrations run to ~1,000-2,000 tokens with the demo BPE (search
  # results dominate); at 1,024, 70% of them were dropped.
  c.seq_len = 2048

  c.total_steps = 2000
  c.optimizer.learning_rate = 1e-3
  c.optimizer.warmup_steps = 100
  c.optimizer.weight_decay = 0.01
  c.log_every = 20
  c.eval_every = 200
  c.ckpt_every = 200

  # RL (stage "rl"): at most ~15 minutes on this CPU on top of SFT.
  c.rl.iterations = 12
  c.rl.tasks_per_iter = 8
  c.rl.group_size = 4
  c.rl.temperature = 1.0
  c.rl.max_turns = 8
  c.rl.max_turn_tokens = 160
  c.rl.max_len = 1536
  c.rl.eval_every = 6
  c.rl.eval_tasks = 200

  if a.runlocal:
    c.rl.iterations = 2
    c.rl.tasks_per_iter = 4
    c.rl.group_size = 2
    c.rl.max_turns = 3
    c.rl.max_turn_tokens = 24
    c.rl.max_len = 2048
    c.rl.eval_every = 0
    c.rl.eval_tasks = 4
    c.model.preset = "tiny"
    c.data.num_tasks = 64
    c.batch_size = 4
    c.seq_len = 2048
    c.total_steps = 20
    c.optimizer.warmup_steps = 2
    c.log_every = 5
    c.eval_every = 10
    c.ckpt_every = 10
  return c
