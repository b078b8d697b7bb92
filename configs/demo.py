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


# Phase 2 of the long SFT (``budget=long2``; with ``from_scratch=True`` the
# pipeline's "sft2" stage), from the phase-1 weights with a fresh Adam:
# after phase 1, teacher-forced accuracy on parallel rows was as low on
# train rows as on test rows (whole tool names 72% vs 68%), so the
# multi-tool kinds were underfit, not failing to generalise. Here fanout,
# parallel and mixed get two shares each of the tasks, and rows of up to
# 2,048 tokens keep the answers of the longest ones (at 1,536, 32% of mixed
# and 10% of parallel demonstrations lost their end). lr 1e-3 again after a
# 100-step warm-up, decayed over the last 300 of 900 steps.
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
  c.model.preset = a.size
  c.model.vocab_size = 0            # from the trained tokenizer
  if a.size == "demo" and not a.runlocal:
    # Narrower than the "demo" preset (hidden 256): on 2 CPU cores hidden
    # 128 buys ~3x more tokens, and the task (copying names, ids and values
    # into calls) needs attention heads more than width. 4 query heads with
    # their own KV heads: 2 heads sharing 1 KV head learnt no copying in 600
    # steps of a pure copy task, 4 x 4 did (docs/cpu_demo.md).
    c.model.hidden_size = 128
    c.model.intermediate_size = 512
    c.model.num_layers = 4
    c.model.num_heads = 4
    c.model.num_kv_heads = 4
    c.model.head_dim = 32
    # model.attention "auto" on the CPU: "blocked" (dense scores in causal
    # query blocks of 128, written backward) for rows up to 2,048 tokens;
    # 1.10x the autodiff reference blocks and 1.16x the chunked flash path at
    # 1,024 on this model (benchmarks/attention_bench.py --preset=config).
    # Log-probs in one piece: at vocab 4096 the logits of a batch are ~128
    # MiB, and chunking them costs ~5% of a step here.
    c.model.logits_chunk = 0
  # The LM head and log-softmax only at loss positions (~19% of an SFT row,
  # at most ~26% in any row at 1,024 tokens), in rows of 30% of the sequence;
  # a fuller row (copy warm-up batches) runs them everywhere. Exact.
  c.model.logits_capacity = 0.3

  # Demonstrations (stage "demos" and the SFT data source).
  c.data.source = "demonstrations"
  c.data.catalog = "procedural"
  c.data.backend = "scripted"
  # The long SFT sees 7,200 of 8,000 demonstrations (900 steps x 8 rows);
  # the pipeline from the shipped policy needs only the tasks.
  c.data.num_tasks = 8000 if a.from_scratch or a.stage == "sft" else 1600
  c.data.kinds = ()                 # () = all, round robin; repeats weight
  c.data.data_dir = ""              # "" = WORKDIR/demos (pipeline) or built
  # "" = train the demo BPE on the train split (copyable pieces:
  # `tokenizer.train_bpe_tokenizer`); RL from the shipped policy must use
  # the shipped tokenizer.
  c.data.tokenizer = ""
  # Short demonstrations: the CPU pays for every token of context. Three
  # search results instead of five, only the planner's thought, and batches
  # padded to their own length bucket, not to seq_len (~1,050 tokens a row).
  c.data.search_top_k = 3
  c.data.thoughts = "plan"
  # The answerer echoes each answer field as the observation shows it
  # (`"owner": "Goran Haddad"`, not `owner: Goran Haddad`): the answer is then
  # a copy of observed text, tokens and all.
  c.data.answer_style = "json"
  c.data.length_bucket = "512,768,1024"   # + seq_len: 4 compiled shapes
  c.data.overlong = "truncate"    # the longest ~10% keep their first turns
  # Several demonstrations per row (segment ids; paraagent_jax/data/packing.py):
  # data.pack=True after the colon. Off here: the demo's SFT recipe and the
  # shipped policy were trained one demonstration per row, and packed rows
  # give each step more demonstrations, so the recipe's step counts would
  # need retuning (docs/cpu_demo.md, "Packing SFT rows").
  c.data.pack = False
  # Options measured and left at their off values (docs/cpu_demo.md):
  # imperfection (a float scales `Imperfection.default()`; 1.0 = default),
  # obs_format "compact" (search results as `name(params)`), context_loss_weight
  # (observation tokens in the loss).
  c.data.imperfection = 1.0
  c.data.obs_format = "full"
  c.data.context_loss_weight = 0.0
  # First 1,000 batches of 32 x 128-token copy rows of random tokens
  # (`copy_mode="induction"`: a random span of random length after a random
  # prefix, then the span again), which a model can only solve with an
  # induction head (copy whatever followed the previous occurrence of the
  # current token). At this size and lr 1e-3 the head forms at steps
  # ~680-880 (loss 8.3 -> 0.7 nats; at lr 3e-3, with 64-token rows or in
  # fewer than ~600 steps it does not form). The old `repeat` rows (S always
  # 61 tokens) were solved by a fixed-offset copy that copies 0% of ids in
  # the demonstrations (docs/cpu_demo.md section 3).
  c.data.copy_warmup = 1000
  c.data.copy_rows = 32
  c.data.copy_len = 128
  c.data.copy_mode = "induction"
  # After the warm-up, every 4th batch is a copy batch: the demonstrations
  # train without wearing the induction head away.
  c.data.copy_every = 4
  # Opening-turn batches (demonstrations cut after their first assistant
  # turn) are not needed once an induction head exists: the policy copies
  # the provider name from the instruction without them (run N1).
  c.data.turn_warmup = 0
  c.data.turn_rows = 64
  c.data.turn_len = 192
  c.data.turn_count = 1
  c.data.turn_system = False
  c.batch_size = 8
  c.seq_len = 1536

  # 1,000 copy batches, then 1,200 batches of which 900 are demonstrations
  # ("short": 300, of which 225 are demonstrations).
  c.total_steps = 2200 if a.budget == "long" else 1300
  # One learning rate for both phases: 1e-3 (3e-3 never forms the induction
  # head), held until the last 300 steps (150 for "short"), then decayed
  # linearly to 1e-4 ("wsd": the stable part does not depend on
  # total_steps, so a longer run continues a shorter one exactly).
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

  # RL (stage "rl"). The pipeline's RL starts from the shipped SFT policy
  # (or, with from_scratch, from WORKDIR/sft) and evaluates it on 200
  # held-out tasks before and after.
  from_shipped = (not a.from_scratch and a.size == "demo"
                  and a.stage in ("pipeline", "rl"))
  if from_shipped:
    c.pipeline.stages = ("demos", "rl")
    c.init_from = SHIPPED_SFT
    c.data.tokenizer = SHIPPED_SFT
  elif a.stage == "pipeline" and a.budget == "long":
    # From scratch: both phases of the shipped policy's recipe, then RL.
    c.pipeline.stages = ("demos", "sft", "sft2", "rl")
    c.pipeline.sft2 = PHASE2
  # RL's own step size. RL starts a fresh Adam, whose first steps move every
  # parameter by about the learning rate however noisy its gradient: from
  # the shipped policy (29.5% held-out), 40 iterations at 2e-4 lost 6 points
  # (23.5%, McNemar p = 0.0075) and at 5e-5 kept it (29.5% at temperature 1.0).
  c.rl.learning_rate = 5e-5
  c.rl.warmup_steps = 0
  c.rl.schedule = "constant"
  # ~30 s an iteration on 2 cores: 56 iterations, two 200-task evaluations
  # and the demos fit the README command in 31 of its 45 minutes. From the
  # shipped policy, 40 iterations gained +2.5 points, 56 gained +6.0
  # (46.5% -> 52.5%, McNemar p = 0.017; docs/cpu_demo.md).
  c.rl.iterations = 56
  c.rl.tasks_per_iter = 8
  c.rl.group_size = 4
  # 0.7, not 1.0: at 1.0 a step with more calls has more tokens to get wrong,
  # so the sampled successes favoured one call a step and RL taught that
  # everywhere (fanout success and calls per execute step fell); at 0.7 (lr
  # 5e-5) held-out success rose 29.5% -> 33.0% (docs/cpu_demo.md).
  c.rl.temperature = 0.7
  # Kinds drawn by the chance that their groups have both successes and
  # failures (recent per-kind rollout success): groups where every sample
  # fails (or succeeds) teach the trajectory level nothing.
  c.rl.task_sampling = "pass_rate"
  c.rl.max_turns = 8
  c.rl.max_turn_tokens = 160
  c.rl.max_len = 2048
  # Observations as the demonstrations show them, whole: on the test split
  # 16% of them are over 256 tokens (36% of parallel tasks': two searches
  # in one step) and the longest is 581. Cut at 256 (the default), the
  # policy lost the second search's results in evaluation and RL.
  c.rl.max_obs_tokens = 640
  c.rl.eval_every = 56               # before RL and at the end
  c.rl.eval_tasks = 200
  # The update's micro-batches hold episodes sorted by length, each padded
  # to its own bucket, not all to max_len: the same update, less compute
  # (tests/test_grpo.py; times in docs/cpu_demo.md).
  c.rl.length_buckets = "1024,1536"
  # 32 episodes of up to 1,536 tokens in one step took 15 GB (OOM-killed on
  # the 24 GB machine); 4 micro-batches of 8 keep it to a few GB.
  c.rl.num_micro_batches = 4

  if a.rl_budget == "long":
    # The long RL recipe (``rl_budget=long``): the README command's RL run
    # on (same seeds, constant learning rate, so its first 56 iterations are
    # the README command's), 4 x 56 iterations, held-out evaluations every
    # 56, a kept checkpoint every 14 (each one can be evaluated or resumed).
    c.rl.iterations = 224
    c.rl.eval_every = 56
    c.rl.ckpt_every = 14
    c.keep_ckpts = 0                 # keep them all (~19 MB each)
  if a.runlocal:
    # The README command in miniature: demonstrations of 64 tasks, then two
    # RL iterations from the shipped policy, which solves some tasks, so the
    # groups have reward spread and the smoke run's RL really updates (from
    # a 20-step model every episode fails alike and RL has nothing to do).
    # With from_scratch, the tiny SFT runs first and RL starts from it.
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
  return c
