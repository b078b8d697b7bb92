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
  if a.size == "demo" and not a.runlocal:
    # Narrower than the "demo" preset (hidden 256): on 2 CPU cores the
    # 15-minute budget buys ~3x more tokens at hidden 128, and the task
    # (copying names, ids and values into calls) needs depth more than width.
    c.model.hidden_size = 128
    c.model.intermediate_size = 512
    c.model.num_layers = 4
    c.model.num_heads = 2     # attention over ~1k-token rows is most of
    c.model.num_kv_heads = 1  # the step: 2 heads are 1.3x faster than 4
    c.model.head_dim = 32
    c.model.attention_block = 128   # causal query blocks: ~1.6x faster steps

  # Demonstrations (stage "demos" and the SFT data source).
  c.data.source = "demonstrations"
  c.data.catalog = "procedural"
  c.data.backend = "scripted"
  # ~1,600 demonstrations are about what 15 minutes of SFT on 2 cores
  # consume (150 steps x 8 rows at ~1,700 tokens/s); more is wasted time.
  c.data.num_tasks = 1600
  c.data.data_dir = ""              # "" = WORKDIR/demos (pipeline) or built
  c.data.tokenizer = ""             # "" = train the demo BPE
  # Short demonstrations: the CPU pays for every token of context. Three
  # search results instead of five, only the planner's thought, and batches
  # padded to their own length bucket, not to seq_len (~950 tokens a row).
  c.data.search_top_k = 3
  c.data.thoughts = "plan"
  c.data.length_bucket = "512,768,1024"   # + seq_len: 4 compiled shapes
  c.data.overlong = "truncate"    # the longest ~8% keep their first turns
  # Options measured on 2026-12-03 and left off because none raised held-out
  # success above 0% within the budget (README "The CPU demo: measured"):
  # imperfection (a float scales `Imperfection.default()`; 1.0 = default),
  # obs_format "compact" (search results as `name(params)`, ~12% fewer
  # tokens a row), context_loss_weight (observation tokens in the loss),
  # copy_warmup/copy_rows/copy_len (synthetic copy batches first).
  c.data.imperfection = 1.0
  c.data.obs_format = "full"
  c.data.context_loss_weight = 0.0
  c.data.copy_warmup = 0
  c.data.copy_rows = 0
  c.data.copy_len = 256
  c.data.copy_mode = "pairs"      # or "repeat" (classic induction rows)
  c.batch_size = 8
  c.seq_len = 1536

  # Sized for the 15-minute budget of the acceptance run (issue 6), not for
  # quality: see the README's "Demo results" for what this reaches.
  c.total_steps = 150
  c.optimizer.learning_rate = 3e-3
  c.optimizer.warmup_steps = 20
  c.optimizer.weight_decay = 0.01
  c.log_every = 10
  c.eval_every = 150
  c.ckpt_every = 50
  c.sft_eval_tasks = 200            # greedy held-out ParaAct after SFT

  # RL (stage "rl"): at most ~15 minutes on this CPU on top of SFT.
  # ~65 s an iteration and ~110 s a 200-task greedy eval (before and after).
  c.rl.iterations = 10
  c.rl.tasks_per_iter = 8
  c.rl.group_size = 4
  c.rl.temperature = 1.0
  c.rl.max_turns = 8
  c.rl.max_turn_tokens = 160
  c.rl.max_len = 1536
  c.rl.eval_every = 10
  c.rl.eval_tasks = 200
  # 32 episodes of up to 1,536 tokens in one step took 15 GB (OOM-killed on
  # the 24 GB machine); 4 micro-batches of 8 keep it to a few GB.
  c.rl.num_micro_batches = 4

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
    c.sft_eval_tasks = 4
  return c
