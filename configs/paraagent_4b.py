"""ParaAgent-4B: Qwen3 from a local HF directory, SFT then RL on OpenAPI tools.

Run (on every worker of a TPU slice; see launch/)::

  python -m paraagent_jax.train \
      --config=configs/paraagent_4b.py:slice=v5p-64,init_from=/ckpt/Qwen3-4B \
      --workdir=gs://bucket/paraagent_4b
  python -m paraagent_jax.train --config=configs/paraagent_4b.py:size=8b,slice=v6e-64 ...
  python -m paraagent_jax.train --config=configs/paraagent_4b.py:runlocal --workdir=/tmp/p4

Arguments: ``size`` (0.6b, 1.7b, 4b, 8b), ``slice`` (v5p-64, v6e-64, cpu),
``stage`` (pipeline, sft, rl) and ``runlocal`` (tiny model from scratch on
the procedural catalog, minutes on a CPU). Every other key can be overridden
after the colon. The mesh and batch presets are starting points, checked only
by the dry run, not on real TPUs::

  python -m paraagent_jax.train --config=configs/paraagent_4b.py --dry_run --fake_devices=64

The paper-style lengths fit both slices by the dry run's compiled memory
analysis (docs/scale.md): chunked attention and log-probs
(``model.attention``, ``model.logits_chunk``), a decode that reads the KV
cache in place, and RL micro-batches of one episode per chip.
"""

from paraagent_jax import config_utils

SIZES = ("0.6b", "1.7b", "4b", "8b")

# Per slice: chips, mesh (data, fsdp, tensor) by model size, HBM per chip.
# FSDP over the whole slice for the small models; 4-way tensor parallel for 8B
# on v6e (32 GB HBM per chip) to keep activations per chip small.
SLICES = {
    "v5p-64": dict(chips=32, hbm_gb=95, mesh={
        "0.6b": (4, 8, 1), "1.7b": (2, 16, 1), "4b": (1, 32, 1),
        "8b": (1, 16, 2)}),
    "v6e-64": dict(chips=64, hbm_gb=32, mesh={
        "0.6b": (4, 16, 1), "1.7b": (2, 32, 1), "4b": (1, 32, 2),
        "8b": (1, 16, 4)}),
    "cpu": dict(chips=1, hbm_gb=0, mesh={s: (1, -1, 1) for s in SIZES}),
}


def get_config(arg=None):
  """The ParaAgent config; ``arg`` is ``key=value,...`` (see the docstring)."""
  a = config_utils.parse_arg(arg, size="4b", slice="v5p-64", stage="pipeline",
                             runlocal=False)
  if a.size not in SIZES:
    raise config_utils.ConfigError(f"size={a.size!r}; expected one of {SIZES}")
  if a.slice not in SLICES:
    raise config_utils.ConfigError(f"slice={a.slice!r}; expected one of "
                                   f"{sorted(SLICES)}")
  c = config_utils.train_defaults()
  c.size, c.slice, c.stage, c.runlocal = a.size, a.slice, a.stage, a.runlocal
  c.hbm_gb = SLICES[a.slice]["hbm_gb"]

  # Model: the architecture comes from init_from's config.json when it is an
  # HF directory; the preset is the fallback (and what the dry run uses).
  c.init_from = f"/ckpt/Qwen3-{a.size.upper()}"
  # The LM head and log-softmax at the loss positions only (SFT's assistant
  # tokens, RL's policy tokens), in rows of 0.3 x the sequence; a batch with a
  # fuller row runs them everywhere, so the loss is exact either way. In the
  # demo's data these are ~19% of an SFT row (at most 25.6%) and ~13% of an RL
  # row. The dry run's step temporaries drop by 0.72 GiB (v5p-64) and 0.40 GiB
  # (v6e-64) with it: the lax.cond's two branches do not add up (docs/scale.md).
  c.model.logits_capacity = 0.3
  c.model.preset = f"qwen3-{a.size}"
  c.model.param_dtype = "float32"   # fp32 master weights and AdamW moments
  c.model.dtype = "bfloat16"
  c.model.scan_layers = True
  c.model.remat = "full"
  data, fsdp, tensor = SLICES[a.slice]["mesh"][a.size]
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = data, fsdp, tensor
  c.distributed = "auto"

  # SFT on the cold-start demonstrations over the OpenAPI catalog.
  c.data.source = "demonstrations"
  c.data.catalog = "openapi"      # the demonstrations and RL (rl.catalog "" follows it)
  c.data.backend = "scripted"
  c.data.num_tasks = 20000
  c.data.data_dir = ""
  c.data.tokenizer = ""             # "" = init_from's tokenizer
  # data.pack=True: demonstrations packed first-fit into the 8,192-token rows
  # (segment ids, no attention across them) instead of one per row. Off by
  # default so the step counts below keep their meaning (one demonstration a row).
  c.data.pack = False
  c.batch_size = 256
  c.seq_len = 8192
  c.num_micro_batches = 4
  c.total_steps = 2000
  c.optimizer.learning_rate = 1e-5
  c.optimizer.warmup_steps = 100
  c.optimizer.weight_decay = 0.01
  c.optimizer.max_grad_norm = 1.0
  c.log_every = 10
  c.eval_every = 200
  c.ckpt_every = 200

  # RL: GRPO with step / phase / trajectory advantages (paper-style settings).
  c.rl.group_size = 8
  c.rl.tasks_per_iter = 64          # 512 rollouts per iteration
  c.rl.iterations = 300
  c.rl.passes = 1
  c.rl.temperature = 1.0
  c.rl.max_turns = 16
  c.rl.max_turn_tokens = 1024
  c.rl.max_len = 16384
  c.rl.max_obs_tokens = 1024
  c.rl.eval_every = 20
  c.rl.eval_tasks = 500
  c.rl.grpo.levels = "traj,phase,step"
  # One 16k-token episode per chip per micro-batch (512 episodes over 32
  # batch shards): the RL step's activations stay ~10 GB a chip.
  c.rl.num_micro_batches = 16
  # No KL term: beta > 0 would keep a frozen copy of the starting policy on
  # every device and run its forward pass each step; the clip-higher
  # (0.2 / 0.28) defaults bound the update.
  c.rl.grpo.beta = 0.0
  c.pipeline.stages = ("demos", "sft", "rl")
  if a.stage == "rl":
    # One optimizer config serves a stage; RL takes a 10x smaller step. (The
    # pipeline stage copies the SFT value: run stage=rl separately for 1e-6.)
    c.optimizer.learning_rate = 1e-6
    c.optimizer.warmup_steps = 10

  if a.runlocal:
    c.init_from = ""
    c.model.preset = "tiny"
    c.model.param_dtype = c.model.dtype = "float32"
    c.model.scan_layers = False
    c.model.remat = "none"
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    c.data.catalog = "procedural"   # RL follows data.catalog
    c.data.num_tasks = 64
    c.batch_size = 4
    # Procedural demonstrations run ~1,000 tokens: 512 dropped all of them.
    c.seq_len = 2048
    c.num_micro_batches = 1
    c.total_steps = 10
    c.optimizer.warmup_steps = 2
    c.log_every = 5
    c.eval_every = 5
    c.ckpt_every = 5
    c.rl.group_size = 4
    c.rl.tasks_per_iter = 2
    c.rl.num_micro_batches = 0      # = num_micro_batches
    c.rl.iterations = 2
    c.rl.max_turns = 4
    c.rl.max_turn_tokens = 96
    c.rl.max_len = 1024
    c.rl.max_obs_tokens = 128
    c.rl.eval_every = 0
    c.rl.eval_tasks = 4
  return c
