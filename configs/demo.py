"""The embedded demo: ToolEnv demonstrations -> SFT -> RL of a small Qwen3 on a CPU.

Tasks come from ToolEnv's procedural catalog (50,011 tools); the SFT data
are the scripted multi-agent demonstrations (`paraagent_jax.coldstart`),
linearised into ParaAct trajectories.

Run::

  python -m paraagent_jax.train --config=configs/demo.py --workdir=/tmp/demo
  python -m paraagent_jax.train --config=configs/demo.py:from_scratch=True --workdir=/tmp/x
  python -m paraagent_jax.train --config=configs/demo.py:stage=sft,budget=long --workdir=/tmp/y
  python -m paraagent_jax.train --config=configs/demo.py:stage=sft,budget=long2,init_from=/tmp/y --workdir=/tmp/y2
  python -m paraagent_jax.train --config=configs/demo.py:rl_budget=long --workdir=/tmp/rl_long
  python -m paraagent_jax.train --config=configs/demo.py:runlocal --workdir=/tmp/z
  python -m paraagent_jax.train --config=configs/demo.py:runlocal,from_scratch=True --workdir=/tmp/w

The default pipeline builds the demonstrations and tasks (WORKDIR/demos),
then runs RL (WORKDIR/rl) from the shipped SFT policy (`SHIPPED_SFT`,
trained once by the ``stage=sft,budget=long`` recipe below and then the
``budget=long2`` phase from its weights; its README says how and what it
scores): RL evaluates that policy greedily on 200 held-out tasks first,
trains, evaluates again and compares the two per task. ``from_scratch=True``
reruns both SFT phases too (WORKDIR/sft and WORKDIR/sft2, ~2 h 15 min on 2
CPU cores) and RL starts from the second. ``stage`` is "pipeline", "demos",
"sft" or "rl"; ``budget`` ("long"; "long2", phase 2, with ``init_from=`` the
phase-1 workdir; or "short": 225 demonstration steps, ~30 minutes) sizes the SFT; ``size`` picks the model preset ("demo" or "tiny");
``rl_budget`` sizes the RL ("readme": 56 iterations, the run command's;
"long": 224, evaluated every 56, a checkpoint kept every 14);
``runlocal`` shrinks the pipeline to a smoke run of a few minutes (RL from
the shipped policy; with ``from_scratch=True``, a tiny SFT first).
"""

import os

from paraagent_jax import config_utils

# The shipped SFT policy (an HF directory with SHA256SUMS; see its README.md).
SHIPPED_SFT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "pretrained", "demo_sft")


# Phase 2 of the long SFT (``budget=long2``; the pipeline's "sft2" stage), from
# phase 1's weights: the multi-tool kinds were underfit, so they get two shares
# of the tasks, and 2,048-token rows keep the longest answers
# (docs/records/cpu_demo.md, "Phase 2").
PHASE2 = {
    "data": {"kinds": ("single", "chain", "fanout", "fanout", "parallel", "parallel",
                       "mixed", "mixed"),
             "num_tasks": 8000,
             "copy_warmup": 0,          # the induction head exists already
             "length_bucket": "512,768,1024,1536"},
    "seq_len": 2048,
    "total_steps": 900,
    "optimizer": {"warmup_steps": 100, "decay_steps": 300},
}


def get_config(arg=None):
  """The demo config; ``arg`` is ``key=value,...``."""
  a = config_utils.parse_arg(arg, stage="pipeline", size="demo", budget="long",
                             from_scratch=False, runlocal=False, rl_budget="readme")
  if a.budget not in ("long", "long2", "short"):
    raise config_utils.ConfigError(f"budget={a.budget!r}; expected long, long2 or short")
  if a.rl_budget not in ("readme", "long"):
    raise config_utils.ConfigError(f"rl_budget={a.rl_budget!r}; expected readme or long")
  init_from = dict(config_utils.split_pairs(arg)).get("init_from", "")
  if a.budget == "long2" and not init_from:
    raise config_utils.ConfigError(
        "budget=long2 continues the budget=long SFT: add init_from=WORKDIR of that run "
        "(e.g. configs/demo.py:stage=sft,budget=long2,init_from=/tmp/sft_long)")
  c = config_utils.train_defaults()
  c.stage = a.stage
  c.size = a.size
  c.budget = a.budget
  c.rl_budget = a.rl_budget
  c.from_scratch = a.from_scratch
  c.runlocal = a.runlocal
  _model(c, a)
  _data(c, a)
  _sft(c, a, init_from)
  # RL starts from the shipped SFT policy unless the SFT is retrained here.
  from_shipped = (not a.from_scratch and a.size == "demo"
                  and a.stage in ("pipeline", "rl"))
  _rl(c, a, from_shipped)
  if a.runlocal:
    _runlocal(c, from_shipped)
  return c


def _model(c, a):
  """The demo model: narrower than the "demo" preset, log-probs unchunked."""
  c.model.preset = a.size
  c.model.vocab_size = 0            # from the trained tokenizer
  if a.size == "demo" and not a.runlocal:
    # Hidden 128 (~3x the tokens of 256 on 2 cores); 4 heads with their own KV
    # heads: 2 sharing 1 never learnt to copy (docs/records/cpu_demo.md).
    c.model.hidden_size = 128
    c.model.intermediate_size = 512
    c.model.num_layers = 4
    c.model.num_heads = 4
    c.model.num_kv_heads = 4
    c.model.head_dim = 32
    # Log-probs in one piece: ~128 MiB of logits at vocab 4096; chunks cost ~5%.
    c.model.logits_chunk = 0
  # The LM head only at loss positions (~19% of an SFT row); exact either way.
  c.model.logits_capacity = 0.3



def _data(c, a):
  """The demonstrations (stage "demos" and the SFT data source)."""
  c.data.source = "demonstrations"
  c.data.catalog = "procedural"
  c.data.backend = "scripted"
  # The long SFT sees 7,200 of them; RL from the shipped policy needs only tasks.
  c.data.num_tasks = 8000 if a.from_scratch or a.stage == "sft" else 1600
  c.data.kinds = ()                 # () = all, round robin; repeats weight
  c.data.data_dir = ""              # "" = WORKDIR/demos (pipeline) or built
  # "" = train the demo BPE on the train split; RL uses the shipped one.
  c.data.tokenizer = ""
  # Short demonstrations (~1,050 tokens a row): the CPU pays for every token.
  c.data.search_top_k = 3
  c.data.thoughts = "plan"
  # Answers echo each field as observed (`"owner": "..."`): a pure copy.
  c.data.answer_style = "json"
  c.data.length_bucket = "512,768,1024"   # + seq_len: 4 compiled shapes
  c.data.overlong = "truncate"    # the longest ~10% keep their first turns
  # Off: the recipe's step counts assume one demonstration per row.
  c.data.pack = False
  # Measured and left off (docs/records/cpu_demo.md).
  c.data.imperfection = 1.0
  c.data.obs_format = "full"
  c.data.context_loss_weight = 0.0
  # 1,000 batches of induction copy rows first: the induction head forms at
  # steps ~680-880 (docs/records/cpu_demo.md, section 3).
  c.data.copy_warmup = 1000
  c.data.copy_rows = 32
  c.data.copy_len = 128
  c.data.copy_mode = "induction"
  # Every 4th batch after it a copy batch, so the head is not worn away.
  c.data.copy_every = 4
  # No opening-turn batches: not needed once the induction head exists.
  c.data.turn_warmup = 0
  c.data.turn_rows = 64
  c.data.turn_len = 192
  c.data.turn_count = 1
  c.data.turn_system = False
  c.batch_size = 8
  c.seq_len = 1536


def _sft(c, a, init_from):
  """The SFT recipe: copy warm-up, then demonstrations (phase 2: ``long2``)."""
  # 1,000 copy batches, then 1,200 of which 900 are demonstrations.
  c.total_steps = 2200 if a.budget == "long" else 1300
  # 1e-3 (3e-3 never forms the head), "wsd": a longer run continues a shorter one.
  c.optimizer.learning_rate = 1e-3
  c.optimizer.schedule = "wsd"
  c.optimizer.decay_steps = 300 if a.budget == "long" else 150
  c.optimizer.end_lr_ratio = 0.1
  c.optimizer.warmup_steps = 20
  c.optimizer.weight_decay = 0.01
  if a.budget == "long2":
    config_utils.merge_nested(c, PHASE2, "PHASE2")
    # Phase 1's tokenizer: an HF directory carries it; a phase-1 workdir
    # has it with its demonstrations (data.tokenizer= overrides).
    c.data.tokenizer = (init_from if os.path.exists(os.path.join(init_from, "tokenizer.json"))
                        else os.path.join(init_from, "demos", "tokenizer"))
  c.log_every = 10
  c.eval_every = 250
  c.ckpt_every = 50
  c.sft_eval_tasks = 200            # greedy held-out ParaAct after SFT


def _rl(c, a, from_shipped):
  """The RL stage of the README command (``rl_budget=long``: continued)."""
  # RL (stage "rl"). The pipeline's RL starts from the shipped SFT policy
  # (or, with from_scratch, from WORKDIR/sft) and evaluates it on 200
  # held-out tasks before and after.
  if from_shipped:
    c.pipeline.stages = ("demos", "rl")
    c.init_from = SHIPPED_SFT
    c.data.tokenizer = SHIPPED_SFT
  elif a.stage == "pipeline" and a.budget == "long":
    # From scratch: both phases of the shipped policy's recipe, then RL.
    c.pipeline.stages = ("demos", "sft", "sft2", "rl")
    c.pipeline.sft2 = PHASE2
  # 5e-5: a fresh Adam at 2e-4 lost 6 points (docs/records/cpu_demo.md).
  c.rl.learning_rate = 5e-5
  c.rl.warmup_steps = 0
  c.rl.schedule = "constant"
  # 56 iterations fit the README command's 45 minutes (~30 s each on 2 cores).
  c.rl.iterations = 56
  c.rl.tasks_per_iter = 8
  c.rl.group_size = 4
  # 0.7: at 1.0 RL learnt one call a step (docs/records/cpu_demo.md).
  c.rl.temperature = 0.7
  # Kinds drawn by the chance that a group of them has reward spread.
  c.rl.task_sampling = "pass_rate"
  c.rl.max_turns = 8
  c.rl.max_turn_tokens = 160
  c.rl.max_len = 2048
  # Observations whole, as in the demonstrations (256 cut parallel tasks' searches).
  c.rl.max_obs_tokens = 640
  c.rl.eval_every = 56               # before RL and at the end
  c.rl.eval_tasks = 200
  # Micro-batches sorted by length, each padded to its bucket: less compute.
  c.rl.length_buckets = "1024,1536"
  # One micro-batch of 32 took 15 GB; 4 of 8 take a few.
  c.rl.num_micro_batches = 4
  if a.rl_budget == "long":
    # The README command's RL continued: its first 56 iterations are the same.
    c.rl.iterations = 224
    c.rl.eval_every = 56
    c.rl.ckpt_every = 14
    c.keep_ckpts = 0                 # keep them all (~19 MB each)


def _runlocal(c, from_shipped):
  """A smoke run of a few minutes."""
  # The README command in miniature (from the shipped policy, so RL updates).
  c.rl.iterations = 2
  c.rl.tasks_per_iter = 4
  c.rl.group_size = 4 if from_shipped else 2
  c.rl.max_turns = 4 if from_shipped else 3
  c.rl.max_turn_tokens = 160 if from_shipped else 24
  c.rl.max_len = 2048
  c.rl.eval_every = 0
  c.rl.eval_tasks = 4
  c.model.preset = "tiny"
  c.data.num_tasks = 64
  c.data.copy_warmup = 2
  c.data.copy_rows = 4
  c.data.copy_len = 64
  c.data.turn_warmup = 2
  c.data.turn_rows = 4
  c.batch_size = 4
  c.seq_len = 2048
  c.total_steps = 20
  c.optimizer.warmup_steps = 2
  c.optimizer.decay_steps = 0      # the last 20%
  c.log_every = 5
  c.eval_every = 10
  c.ckpt_every = 10
  c.sft_eval_tasks = 4
  if not from_shipped:
    c.pipeline.sft2 = {"data": {"kinds": PHASE2["data"]["kinds"], "num_tasks": 32,
                                "copy_warmup": 0},
                       "total_steps": 4,
                       "optimizer": {"warmup_steps": 1, "decay_steps": 0}}
