"""Python configs in the big_vision style: ``configs/x.py:key=value,...``.

A config file defines ``get_config(arg=None) -> ml_collections.ConfigDict``.
``arg`` is the text after the colon. The file reads the few arguments that
change its *shape* (``runlocal``, ``size``, ``stage``) with `parse_arg`;
afterwards `load_config` applies every ``key=value`` pair as an override of
the returned config, typed by the value already there, so that any key,
nested ones with dots included (``optimizer.learning_rate=3e-4``), can be set
from the command line. A key that neither the file's arguments nor the config
know is an error that names the closest keys. Every argument a file reads is
also stored in its config, so both steps agree.

Values: bools (``True``/``false``/``1``/``0``), ints, floats, strings, and
tuples or lists written with brackets (``mesh_shape=(2,2,2)``); commas inside
brackets or quotes do not split pairs.

Every error is a `ConfigError` whose message is one line, so the command line
can print it without a traceback.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import os
from typing import Any, Iterator, Mapping

import ml_collections


class ConfigError(ValueError):
  """A bad config path, key or value; the message is one line."""


def split_pairs(arg: str | None) -> list[tuple[str, str]]:
  """Splits ``"a=1,b.c=(1,2),d='x,y'"`` into ``[(key, raw_value), ...]``.

  Commas split pairs only outside brackets and quotes. A bare ``key`` (no
  ``=``) means ``key=True``, so ``:runlocal`` works like big_vision's.
  """
  if not arg:
    return []
  parts, depth, quote, cur = [], 0, None, []
  for ch in arg:
    if quote:
      quote = None if ch == quote else quote
    elif ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      parts.append("".join(cur))
      cur = []
      continue
    cur.append(ch)
  if quote or depth:
    raise ConfigError(f"unbalanced brackets or quotes in config arguments "
                      f"{arg!r}")
  parts.append("".join(cur))
  pairs = []
  for part in parts:
    part = part.strip()
    if not part:
      continue
    key, sep, value = part.partition("=")
    key = key.strip()
    if not key or any(c.isspace() for c in key):
      raise ConfigError(f"bad config argument {part!r}; expected key=value")
    pairs.append((key, value.strip() if sep else "True"))
  return pairs


def _literal(raw: str):
  try:
    return ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    return raw


def parse_value(key: str, raw: str, default: Any) -> Any:
  """Converts ``raw`` to the type of ``default`` (the value it replaces)."""
  # bool before int: bool is a subclass of int.
  if isinstance(default, bool):
    low = raw.lower()
    if low in ("true", "1", "yes"):
      return True
    if low in ("false", "0", "no"):
      return False
    raise ConfigError(f"{key}={raw!r}: expected a bool (True/False)")
  if isinstance(default, int):
    try:
      return int(raw)
    except ValueError:
      raise ConfigError(f"{key}={raw!r}: expected an int") from None
  if isinstance(default, float):
    try:
      return float(raw)
    except ValueError:
      raise ConfigError(f"{key}={raw!r}: expected a float") from None
  if isinstance(default, str):
    value = _literal(raw)
    return value if isinstance(value, str) else raw
  if isinstance(default, (tuple, list)):
    value = _literal(raw)
    if not isinstance(value, (tuple, list)):
      value = (value,)
    return type(default)(value)
  if default is None:
    return _literal(raw) if raw != "None" else None
  raise ConfigError(f"{key}: cannot set a value of type "
                    f"{type(default).__name__} from the command line")


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Reads a config file's own arguments, typed by ``defaults``.

  Pairs whose key is not in ``defaults`` are left for `load_config`, which
  applies them as overrides of the finished config (and rejects unknown
  ones there).

  Example::

    def get_config(arg=None):
      a = config_utils.parse_arg(arg, runlocal=False, stage="sft")

  Returns:
    A ConfigDict with exactly the keys of ``defaults``.
  """
  out = dict(defaults)
  for key, raw in split_pairs(arg):
    if key in defaults:
      out[key] = parse_value(key, raw, defaults[key])
  return ml_collections.ConfigDict(out)


def iter_keys(config, prefix: str = "") -> Iterator[str]:
  """All dotted leaf and node keys of a (nested) ConfigDict."""
  for key in config.keys():
    path = prefix + key
    yield path
    value = config[key]
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      yield from iter_keys(value, path + ".")


def unknown_key(key: str, config) -> ConfigError:
  """A `ConfigError` for ``key``, naming the closest keys ``config`` has."""
  keys = list(iter_keys(config))
  close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
  leaf = key.rsplit(".", 1)[-1]
  close += [k for k in keys if k.rsplit(".", 1)[-1] == leaf and k not in close]
  hint = (f"; did you mean {', '.join(close[:3])}?" if close
          else "; see the config file for the keys")
  return ConfigError(f"unknown config key {key!r}{hint}")


def set_override(config: ml_collections.ConfigDict, key: str, raw: str):
  """Sets dotted ``key`` of ``config`` from its command-line text ``raw``."""
  node, parts = config, key.split(".")
  for i, part in enumerate(parts):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or (
        part not in node):
      raise unknown_key(key, config)
    if i < len(parts) - 1:
      node = node[part]
  last = parts[-1]
  current = node[last]
  if isinstance(current, (ml_collections.ConfigDict, dict)):
    raise ConfigError(f"{key} is a group of settings, not a value; set one "
                      f"of {', '.join(key + '.' + k for k in current)}")
  # Replacing an existing key is allowed even on a locked ConfigDict.
  node[last] = parse_value(key, raw, current)


def split_spec(spec: str) -> tuple[str, str]:
  """``"configs/x.py:a=1"`` -> ``("configs/x.py", "a=1")``."""
  path, _, arg = spec.partition(":")
  # "C:\\..." never reaches us on the platforms we run on; keep it simple.
  return path, arg


def _import_file(path: str):
  if not path.endswith(".py"):
    raise ConfigError(f"config {path!r} is not a .py file "
                      f"(expected configs/NAME.py[:key=value,...])")
  if not os.path.isfile(path):
    here = os.path.dirname(path) or "."
    known = (sorted(f for f in os.listdir(here) if f.endswith(".py"))
             if os.path.isdir(here) else [])
    hint = f"; available in {here}: {', '.join(known)}" if known else ""
    raise ConfigError(f"config file {path!r} not found{hint}")
  name = "paraagent_config_" + os.path.basename(path)[:-3]
  module_spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"config file {path!r} defines no get_config(arg)")
  return module


def load_config(spec: str) -> ml_collections.ConfigDict:
  """Loads ``configs/x.py[:key=value,...]`` and applies the overrides.

  Raises:
    ConfigError: missing file, unknown key (with close matches) or a value
      that does not fit the key's type. The message is one line.
  """
  path, arg = split_spec(spec)
  module = _import_file(path)
  pairs = split_pairs(arg)
  config = module.get_config(arg or None)
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f"{path}: get_config must return an "
                      f"ml_collections.ConfigDict, got {type(config).__name__}")
  for key, raw in pairs:
    set_override(config, key, raw)
  return config


def parse_list(text, sep: str = ",") -> list[str]:
  """``"a,b,,c"`` -> ``["a", "b", "c"]`` (a config's list of names; a tuple or
  list passes through). Every list-valued config key is read with this."""
  if isinstance(text, (tuple, list)):
    return [str(x) for x in text]
  return [p.strip() for p in str(text or "").split(sep) if p.strip()]


def to_dict(config) -> dict:
  """A plain, JSON-serialisable dict of a ConfigDict (tuples as lists)."""
  if isinstance(config, (ml_collections.ConfigDict, dict)):
    return {k: to_dict(config[k]) for k in config.keys()}
  if isinstance(config, (tuple, list)):
    return [to_dict(v) for v in config]
  return config


# The default logical-axis rules (`paraagent_jax.sharding`): logical name ->
# mesh axes, "" = replicated, "a,b" = split over both. Parameters:
SHARDING_RULES = {
    "vocab": "tensor", "embed": "fsdp", "heads": "tensor", "kv_heads": "tensor",
    "head_dim": "", "mlp": "tensor", "norm": "", "layers": "",
    # Activations and the KV cache:
    "batch": "data,fsdp", "seq": "", "cache_seq": "", "act_embed": "",
    "act_heads": "tensor", "act_kv_heads": "tensor", "act_mlp": "tensor",
    "act_vocab": "tensor",
}


def train_defaults() -> ml_collections.ConfigDict:
  """The keys every training config has, with neutral defaults.

  Config files start from this and change what they need, so that the
  trainer can rely on every key existing (and command-line overrides of a
  key that a file does not mention still work).

  Over 100 lines on purpose: one flat list of every key with its default and
  a one-line meaning, which `--print_config` and the docs read as one table.
  """
  c = ml_collections.ConfigDict()
  c.stage = "sft"            # "sft" | "rl" | "pipeline"
  c.runlocal = False
  c.seed = 0
  # An HF directory (config.json + *.safetensors) or an Orbax checkpoint
  # (workdir, its checkpoints/ dir or one step dir); "" = from scratch.
  # Used only when the workdir has no checkpoint of its own.
  c.init_from = ""
  # Multi-host: "auto" initialises jax.distributed on a multi-host TPU slice.
  c.distributed = "auto"     # "auto" | "on" | "off"
  # Several processes: one that sends no heartbeat for this long (killed,
  # crashed, cut off) stops the others, each with one line naming it
  # (paraagent_jax/trainer/liveness.py); rerun to resume from the last checkpoint.
  c.host_timeout_s = 120.0

  c.model = ml_collections.ConfigDict()
  c.model.preset = "tiny"    # a paraagent_jax.models.qwen3 preset
  c.model.vocab_size = 0     # 0 = the preset's (or the tokenizer's)
  c.model.param_dtype = "float32"
  c.model.dtype = "float32"
  c.model.scan_layers = False
  c.model.remat = "none"
  # > 0: causal query blocks in the training forward of "reference" (exact,
  # skips the upper triangle; ~1.7x faster SFT steps at T 1024 on the CPU).
  # 0 = dense. The query block of "blocked" (0 = 128).
  c.model.attention_block = 0
  # "auto" | "reference" | "blocked" | "chunked" | "xla" | "cudnn" | "splash"
  # | "tokamax" (optional package: requirements-tokamax.txt)
  # (see paraagent_jax/models/attention.py; auto = splash on TPU, cuDNN on GPU
  # for bf16, on the CPU blocked up to 2,048 tokens, chunked beyond) and the
  # block size of the chunked kernels.
  c.model.attention = "auto"
  c.model.attention_chunk = 256
  # LM head + log-softmax over this many positions at a time (0 = all).
  c.model.logits_chunk = 512
  # > 0: the LM head runs only at loss positions (the SFT loss mask, the RL
  # policy tokens), gathered into rows of this fraction of the sequence; a
  # batch with a fuller row runs it everywhere (exact either way). 0 = off.
  c.model.logits_capacity = 0.0

  # Mesh axis sizes (paraagent_jax.sharding.make_mesh); -1 = all the rest.
  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
  # Logical axis name -> mesh axis ("data", "fsdp", "tensor"; "" = replicated;
  # batch-like names may list several, e.g. "data,fsdp"). The trainer refuses
  # a rule whose mesh axis does not divide a parameter, and (on meshes with
  # fsdp x tensor > 1) a parameter of min_sharded_size elements or more left
  # replicated.
  c.sharding = ml_collections.ConfigDict()
  c.sharding.rules = ml_collections.ConfigDict(dict(SHARDING_RULES))
  c.sharding.min_sharded_size = 2 ** 14

  c.data = ml_collections.ConfigDict()
  c.data.source = "synthetic"  # a module of paraagent_jax.data
  c.data.seed = 0
  c.data.vocab_size = 256      # synthetic only
  c.data.min_len = 2
  c.data.max_len = 16
  c.batch_size = 8           # global batch (rows)
  c.seq_len = 64
  c.num_micro_batches = 1

  c.total_steps = 100
  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.learning_rate = 1e-3
  c.optimizer.warmup_steps = 10
  c.optimizer.total_steps = 0   # schedule length; 0 = total_steps
  c.optimizer.schedule = "cosine"
  c.optimizer.end_lr_ratio = 0.1
  c.optimizer.decay_steps = 0   # "wsd": length of the final decay (0 = last 20%)
  c.optimizer.weight_decay = 0.0
  c.optimizer.max_grad_norm = 1.0

  c.log_every = 10
  c.eval_every = 0           # 0 = no validation loss
  c.eval_batches = 2
  c.sft_eval_tasks = 0       # > 0: greedy ParaAct on that many test tasks after SFT
  c.ckpt_every = 50
  c.keep_ckpts = 3
  c.async_ckpt = True
  c.progress = True
  c.tensorboard = True

  # How every turn is written (docs/protocol.md, "Formats"): "tags"
  # (<call>{...}</call> ... </step>, the CPU demo's) or "qwen3" (<tool_call>
  # blocks, tool messages, every turn through the tokenizer's own chat template).
  # chat_template: a Jinja file used instead of the tokenizer's ("" = its own).
  c.protocol = ml_collections.ConfigDict(dict(format="tags", chat_template=""))

  # The RL stage's own keys, so that overrides like rl.group_size=8 are
  # typed and checked.
  c.rl = rl_defaults()
  c.pipeline = ml_collections.ConfigDict()
  c.pipeline.stages = ("demos", "sft", "rl")
  # A second SFT phase ("sft2" in pipeline.stages): these keys (nested like
  # the config, e.g. {"seq_len": 2048, "data": {"kinds": (...)}}) replace the
  # run's for that stage, which starts from WORKDIR/sft's weights with its
  # tokenizer and builds its own demonstrations (WORKDIR/sft2/demos).
  c.pipeline.sft2 = ml_collections.ConfigDict()
  # Test hooks, off by default. nan_at_step=N > 0: the parameters turn to
  # NaN right before optimizer step N (SFT and RL), to test the NaN stop.
  # rows_log=DIR: each SFT process appends the ids of the rows it trained on,
  # one JSON line per step, to DIR/rows_<process>.jsonl.
  c.debug = ml_collections.ConfigDict(dict(nan_at_step=0, rows_log=""))
  return c


# ToolEnv's task kinds, the RL stage's default mix.
KINDS = "single,parallel,chain,fanout,mixed"


def rl_defaults() -> ml_collections.ConfigDict:
  """Defaults of ``config.rl`` (typed keys for command-line overrides)."""
  c = ml_collections.ConfigDict()
  c.catalog = ""                # "" = data.catalog (the demonstrations'), else procedural
  c.catalog_seed = 0
  # The catalog seed of the *training* tasks (-1 = catalog_seed). Another seed
  # builds other provider names (a procedural catalog), most never seen in the
  # SFT data, as held-out providers are; held-out evaluation stays on
  # catalog_seed's test split (a provider's split is a function of its name,
  # so no held-out provider becomes a training one).
  c.train_catalog_seed = -1
  c.task_seed = 0
  c.kinds = KINDS
  c.strategy = "paraact"
  c.tokenizer = ""              # "" = the SFT data's tokenizer
  c.iterations = 20
  c.tasks_per_iter = 4
  # "round_robin": kinds in turn. "pass_rate": kinds drawn with weight
  # 1 - p^G - (1-p)^G (the chance a group of G samples has spread in its
  # trajectory reward), p = the kind's rollout success over the last
  # sampling_window iterations (Beta(1, 1) prior), floor sampling_floor.
  c.task_sampling = "round_robin"
  c.sampling_window = 5
  c.sampling_floor = 0.05
  c.group_size = 4
  c.passes = 1                  # optimisation passes (K) over each batch
  c.temperature = 1.0
  c.top_k = 0
  c.top_p = 1.0
  # How a sampled token is drawn: "gumbel" (jax.random.categorical) or
  # "inverse_cdf" (one uniform per row: the same distribution, another random
  # stream, cheaper on the CPU; benchmarks/draw_bench.py).
  c.draw = "gumbel"
  c.max_turns = 8
  c.max_turn_tokens = 160
  c.max_len = 1536
  c.max_obs_tokens = 256
  # Token lengths of the update's micro-batches ("1024,1536"): episodes are
  # sorted by length and each micro-batch is padded to the smallest of these
  # (or max_len) that holds it, one compilation per length, the same update
  # (`learner.step.build_sorted_train_step`). "" = one scan over micro-batches
  # of max_len rows.
  c.length_buckets = ""
  c.eval_every = 5              # iterations; 0 = only at the end
  c.eval_tasks = 40             # held-out test tasks (kinds round robin)
  c.ckpt_every = 1              # iterations between checkpoints (and the last)
  c.token_budget = 0            # max real tokens per batch; 0 = no budget
  c.num_micro_batches = 0       # RL step micro-batches; 0 = config.num_micro_batches
  # RL's own optimizer settings over config.optimizer (which a pipeline shares
  # with SFT): peak learning rate (0 = optimizer's), warmup (-1 = optimizer's)
  # and schedule ("" = optimizer's). The schedule's length is always RL's own
  # number of optimizer steps (iterations x passes).
  c.learning_rate = 0.0
  c.warmup_steps = -1
  c.schedule = ""
  c.grpo = ml_collections.ConfigDict(dict(
      clip_eps_low=0.2, clip_eps_high=0.28, beta=0.0, entropy_coef=0.0,
      aggregation="token_mean", levels="traj,phase,step", normalize="mean_std",
      drop_no_spread_groups=True, mask_truncated=False,
      # Truncated importance sampling on the sampler/trainer log-prob ratio
      # (0 = off; a cap >= 1, e.g. 2.0; needs passes=1). Off: on the CPU in
      # fp32 the two agree (train/logp_gap_max ~1e-6).
      tis_cap=0.0))
  return c


def demonstration_defaults() -> ml_collections.ConfigDict:
  """Defaults of the ``config.data`` keys of the cold start (stage ``demos``)
  and the ``demonstrations`` SFT source: the one place they are set.

  A config sets only what it changes; `with_defaults` fills the rest.
  """
  c = ml_collections.ConfigDict()
  # The cold start (paraagent_jax.coldstart.build).
  c.seed = 0
  c.num_tasks = 100
  c.test_tasks = -1             # -1 = max(8, num_tasks // 10)
  c.kinds = ()                  # () = every kind, round robin
  c.catalog = "procedural"
  c.backend = "scripted"        # "scripted" | "chat"
  c.search_top_k = 0            # 0 = the search tool's default
  c.imperfection = None         # None = Imperfection.default(); a float scales it
  c.answer_style = "label"
  c.chat = ml_collections.ConfigDict()   # backend "chat": base_url, model, ...
  c.batch_size = 256
  c.thoughts = "full"
  c.obs_format = "full"
  # The SFT source (paraagent_jax.data.demonstrations).
  c.data_dir = ""
  c.tfds_dir = ""               # "" = data_dir/tfds (a local cache for gs://)
  c.tokenizer = ""              # "" = data_dir/tokenizer (trained if absent)
  c.tokenizer_vocab_size = 4096
  c.overlong = "drop"           # "drop" | "truncate" rows over seq_len
  c.length_bucket = 0           # int step or "a,b,c" padded lengths; 0 = seq_len
  c.pack = False                # several demonstrations per row (segment ids)
  c.context_loss_weight = 0.0
  c.copy_warmup = 0
  c.copy_len = 256
  c.copy_rows = 0
  c.copy_mode = "pairs"
  c.copy_every = 0
  c.turn_warmup = 0
  c.turn_rows = 0
  c.turn_len = 384
  c.turn_count = 1
  c.turn_system = True
  return c


def with_defaults(cfg, defaults: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``defaults`` with the keys ``cfg`` sets (a ConfigDict, dict, object or
  None); a key set to None keeps its default. Keys ``defaults`` lacks are kept."""
  out = defaults.to_dict()
  if cfg is not None:
    items = cfg.items() if hasattr(cfg, "items") else vars(cfg).items()
    out.update({k: v for k, v in items if v is not None})
  return ml_collections.ConfigDict(out)


def merge_nested(config, overrides, where: str = "overrides") -> None:
  """Sets nested ``overrides`` (a dict/ConfigDict) into ``config`` in place.

  Raises:
    ConfigError: a key that ``config`` does not have (named by ``where``).
  """
  for key, value in dict(overrides).items():
    if key not in config:
      raise ConfigError(f"{where}.{key}: not a config key")
    if isinstance(value, (dict, ml_collections.ConfigDict)) and isinstance(
        config[key], ml_collections.ConfigDict):
      merge_nested(config[key], value, f"{where}.{key}")
    else:
      config[key] = value


def config_from_mapping(cls, values: Mapping[str, Any] | None):
  """Builds a frozen config dataclass from a mapping, rejecting unknown keys.

  Accepts a dict or an ml_collections ConfigDict (anything with ``items``).
  """
  if values is None:
    return cls()
  if isinstance(values, cls):
    return values
  names = {f.name for f in dataclasses.fields(cls)}
  items = dict(values.items())
  unknown = set(items) - names
  if unknown:
    raise ValueError(f"unknown {cls.__name__} keys {sorted(unknown)}; "
                     f"known: {sorted(names)}")
  return cls(**{k: tuple(v) if isinstance(v, list) else v
                for k, v in items.items()})
