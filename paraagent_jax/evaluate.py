r"""Evaluation entry point: policies x strategies x benchmarks -> reports.

    python -m paraagent_jax.evaluate --config=configs/evaluate.py \
        --workdir=/tmp/eval [--checkpoint=/tmp/demo/rl]
    python -m paraagent_jax.evaluate --compare=/tmp/eval_a,/tmp/eval_b

``--checkpoint`` is a training workdir (Orbax; its ``config.json`` gives the
model) or a Hugging Face directory; without it the config's ``policy`` is
used (``oracle``: the scripted upper bound through the text protocol;
``api``: an OpenAI-compatible endpoint). Per-task records are appended as
they finish (`evaluation.runner`), so a killed evaluation resumes; at the end
``report.md``, ``report.json`` and PNG plots are written to the workdir.

Benchmarks (``benchmarks=`` in the config): ``toolenv`` (held-out test split
of each catalog in ``catalog``), ``bfcl`` (open-world and closed settings,
scored by the BFCL-rule checker) and ``stabletoolbench`` (a user's query and
tool files on ToolEnv's simulator, judge-free metrics); see
`paraagent_jax.evaluation.benchmarks`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from absl import app
from absl import flags
from absl import logging

# --config and --workdir are train.py's flags (one absl flag namespace per
# process); here --config defaults to configs/evaluate.py.
from paraagent_jax import train as _train  # pylint: disable=g-bad-import-order,wrong-import-position

_CONFIG = _train._CONFIG  # pylint: disable=protected-access
_WORKDIR = _train._WORKDIR  # pylint: disable=protected-access
DEFAULT_CONFIG = "configs/evaluate.py"
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Training workdir or HF dir "
                                  "to evaluate (sets policy=checkpoint).")
_COMPARE = flags.DEFINE_list("compare", [], "Workdirs (or report.json files) to "
                             "put side by side instead of evaluating.")
_TRANSCRIPTS = flags.DEFINE_integer("transcripts", 0, "Print this many example "
                                    "transcripts (one solved and one failed per "
                                    "kind first) after the table.")


def load_checkpoint_model(path: str, vocab_size: int):
  """A Qwen3 from an HF directory or an Orbax training workdir."""
  # pylint: disable=g-import-not-at-top
  import ml_collections
  from flax import nnx
  from paraagent_jax import checkpoint as ckpt_lib
  from paraagent_jax import config_utils
  from paraagent_jax import train as train_lib
  from paraagent_jax.models import qwen3
  # pylint: enable=g-import-not-at-top
  if not os.path.exists(path):
    raise config_utils.ConfigError(f"--checkpoint={path}: no such directory")
  if train_lib.is_hf_dir(path):
    from paraagent_jax.models import hf_io  # pylint: disable=g-import-not-at-top
    return hf_io.load_hf(path)
  found = ckpt_lib.find_checkpoint(path)
  if found is None:
    raise config_utils.ConfigError(f"--checkpoint={path}: neither an HF directory "
                                   "nor a training workdir with checkpoints")
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise config_utils.ConfigError(f"--checkpoint={path}: no config.json (the run "
                                   "config) next to the checkpoints")
  with open(cfg_path) as f:
    run_cfg = ml_collections.ConfigDict(json.load(f))
  run_cfg.init_from = ""
  model_cfg = train_lib.model_config(run_cfg, vocab_size=vocab_size)
  model = nnx.eval_shape(lambda: qwen3.Qwen3(model_cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract = nnx.split(model)
  state = ckpt_lib.restore_model_state(path, abstract)
  return nnx.merge(graphdef, state)


_TEXT_TOKENIZER: list = []


def _text_policy_tokenizer(workdir: str = ""):
  """A BPE for text-level policies (oracle, API), which bring no tokenizer.

  Their token counts only set budgets (max_len) and the tokens reported, so
  it is trained on what episodes contain: the strategies' system prompts and
  scripted episodes of ToolEnv train tasks (never the test split). Saved in
  ``workdir/text_tokenizer`` so a resumed evaluation counts the same tokens.
  """
  # pylint: disable=g-import-not-at-top
  import toolenv
  from paraagent_jax import tokenizer as tok_lib
  from paraagent_jax.paraact import strategies
  # pylint: enable=g-import-not-at-top
  out = os.path.join(workdir, "text_tokenizer") if workdir else None
  if out and os.path.exists(os.path.join(out, "tokenizer.json")):
    return tok_lib.load_tokenizer(out)
  if _TEXT_TOKENIZER:
    # Same texts give the same BPE: reuse this process's (tests, several runs).
    tok = _TEXT_TOKENIZER[0]
    if out:
      tok.save_pretrained(out)
    return tok
  texts = [strategies.get_strategy(s).system_prompt() for s in strategies.STRATEGY_NAMES]
  gen = toolenv.TaskGenerator(toolenv.load_catalog("procedural", seed=0), seed=1)
  for t in gen.generate(100, split="train"):
    texts.append(t.instruction)
    for s in ("paraact", "react"):
      texts += [strategies.get_strategy(s).render_step(x) for x in toolenv.oracle.solve(t, s)]
  tok = tok_lib.train_bpe_tokenizer(texts, vocab_size=2048, out_dir=out)
  _TEXT_TOKENIZER.append(tok)
  return tok


def _tokenizer(config, checkpoint: str, workdir: str = ""):
  """The policy's tokenizer: config, checkpoint dir, or a small BPE for the oracle."""
  # pylint: disable=g-import-not-at-top
  from paraagent_jax import config_utils
  from paraagent_jax import tokenizer as tok_lib
  # pylint: enable=g-import-not-at-top
  cands = [config.tokenizer]
  if checkpoint:
    cands += [checkpoint, os.path.join(checkpoint, "tokenizer")]
    try:
      with open(os.path.join(checkpoint, "config.json")) as f:
        data = json.load(f).get("data", {})
      cands += [data.get("tokenizer", ""), os.path.join(data.get("data_dir", "") or "-",
                                                         "tokenizer")]
    except (OSError, ValueError):
      pass
  for c in cands:
    if c and os.path.exists(os.path.join(c, "tokenizer.json")):
      return tok_lib.load_tokenizer(c)
  if config.policy in ("oracle", "api"):
    return _text_policy_tokenizer(workdir)
  raise config_utils.ConfigError("no tokenizer found: set tokenizer=PATH (a directory "
                                 "with tokenizer.json)")


def run(config, workdir: str, checkpoint: str = "", transcripts: int = 0) -> dict:
  """Runs every (strategy, benchmark) of ``config``; writes and returns the report."""
  # pylint: disable=g-import-not-at-top
  import toolenv
  from paraagent_jax import api_client
  from paraagent_jax import config_utils
  from paraagent_jax import rl_stage
  from paraagent_jax.evaluation import benchmarks as bench_lib
  from paraagent_jax.evaluation import report as report_lib
  from paraagent_jax.evaluation import runner
  from paraagent_jax.paraact import chat_format, policies
  # pylint: enable=g-import-not-at-top
  if checkpoint:
    config.policy = "checkpoint"
  if config.policy not in ("oracle", "checkpoint", "api"):
    raise config_utils.ConfigError(f"policy={config.policy!r}; expected oracle, "
                                   "checkpoint or api")
  if config.policy == "checkpoint" and not checkpoint:
    raise config_utils.ConfigError("policy=checkpoint needs --checkpoint=DIR")
  if checkpoint and not os.path.exists(checkpoint):
    raise config_utils.ConfigError(f"--checkpoint={checkpoint}: no such directory")
  if checkpoint:
    from paraagent_jax import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
    hint = ckpt_lib.pipeline_hint(checkpoint)
    if hint:
      raise config_utils.ConfigError(f"--checkpoint={checkpoint}: {hint}")
  known = ("toolenv", "bfcl", "stabletoolbench")
  for bench in [b for b in config.benchmarks.split(",") if b]:
    if bench not in known:
      raise config_utils.ConfigError(f"benchmarks: unknown {bench!r}; expected one of "
                                     f"{', '.join(known)}")
  os.makedirs(workdir, exist_ok=True)
  tok = _tokenizer(config, checkpoint, workdir)
  model = load_checkpoint_model(checkpoint, len(tok)) if checkpoint else None
  name = config.policy_name or (os.path.basename(os.path.normpath(checkpoint))
                                if checkpoint else config.policy)
  rcfg = rl_stage.rollout_config(config.rollout)
  if config.policy in ("oracle", "api"):
    # Text-level policies hold no KV cache: their context is the endpoint's,
    # and BFCL's closed prompts (tens of function docs) outgrow a demo budget.
    rcfg = dataclasses.replace(rcfg, max_len=max(rcfg.max_len, config.text_max_len))

  def fmt_for(strategy):
    return chat_format.ChatFormat(tok, strategy=strategy)

  def make_policy(strategy, plan_fn=None):
    fmt = fmt_for(strategy)
    if config.policy == "oracle":
      if plan_fn is not None:
        return bench_lib.PlanOraclePolicy(fmt, plan_fn, strategy=strategy)
      return policies.OraclePolicy(fmt, strategy=strategy)
    if config.policy == "api":
      client = api_client.ChatClient(base_url=config.api.base_url, model=config.api.model,
                                     api_key=os.environ.get(config.api.api_key_env, ""))
      return policies.APIPolicy(fmt, client)
    return policies.JaxPolicy(model, fmt, max_len=rcfg.max_len,
                              max_turn_tokens=rcfg.max_turn_tokens, temperature=0.0)

  records = []
  benchmarks = [b for b in config.benchmarks.split(",") if b]
  strategies = [s for s in config.strategies.split(",") if s]
  common = dict(strategies=strategies, policy_name=name, workdir=workdir,
                rollout_config=rcfg, batch_size=config.batch_size, seed=config.seed)
  for bench in benchmarks:
    if bench == "toolenv":
      for cat_name in [c for c in config.catalog.split(",") if c]:
        catalog = toolenv.load_catalog(cat_name, seed=config.catalog_seed)
        kinds = [k for k in config.kinds.split(",") if k]
        try:
          tasks = runner.toolenv_tasks(catalog, num_per_kind=config.num_per_kind,
                                       seed=config.task_seed, kinds=kinds)
        except ValueError as e:
          raise config_utils.ConfigError(f"toolenv-{cat_name}: {e}") from e
        for strategy in strategies:
          records += runner.run_toolenv(make_policy, fmt_for, catalog, tasks,
                                        strategy=strategy, policy_name=name,
                                        workdir=workdir, rollout_config=rcfg,
                                        batch_size=config.batch_size, seed=config.seed,
                                        benchmark=f"toolenv-{cat_name}")
    elif bench == "bfcl":
      try:
        entries = bench_lib.bfcl_entries(
            config.bfcl_source, [c for c in config.bfcl_categories.split(",") if c],
            limit=config.bfcl_limit)
      except (FileNotFoundError, ValueError) as e:
        raise config_utils.ConfigError(f"bfcl: {e}") from e
      records += bench_lib.run_bfcl(
          make_policy, fmt_for, entries,
          settings=[s for s in config.bfcl_settings.split(",") if s], **common)
    elif bench == "stabletoolbench":
      if not (config.stb_queries and config.stb_tools):
        raise config_utils.ConfigError(
            "stabletoolbench: set stb_queries=FILE[;FILE...] (StableToolBench query "
            "JSON) and stb_tools=DIR (its tools directory)")
      try:
        records += bench_lib.run_stabletoolbench(
            make_policy, fmt_for, [q for q in config.stb_queries.split(";") if q],
            config.stb_tools, settings=[s for s in config.stb_settings.split(",") if s],
            limit=config.stb_limit, **common)
      except (FileNotFoundError, ValueError) as e:
        raise config_utils.ConfigError(f"stabletoolbench: {e}") from e
    else:
      raise config_utils.ConfigError(f"benchmarks: unknown {bench!r}; expected "
                                     "toolenv, bfcl or stabletoolbench")
  rep = report_lib.write_report(records, workdir)
  report = report_lib.build_report(records)
  print(report_lib.terminal_table(report), flush=True)
  for ex in report["transcripts"][:max(0, int(transcripts))]:
    print(report_lib.format_transcript(ex, max_chars=0) + "\n", flush=True)
  print(f"evaluate: report {rep['markdown']} (every column, per-kind turns and "
        f"calls, example transcripts), "
        f"{rep['json']}; per-task records with transcripts in {workdir}/records",
        flush=True)
  return rep


def main(argv) -> None:
  """Command line: one-line errors for bad input."""
  # pylint: disable=g-import-not-at-top
  from paraagent_jax import checkpoint as ckpt_lib
  from paraagent_jax import config_utils
  # pylint: enable=g-import-not-at-top
  if len(argv) > 1:
    sys.exit(f"paraagent_jax.evaluate: error: unexpected arguments {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    if _COMPARE.value:
      from paraagent_jax.evaluation import report as report_lib  # pylint: disable=g-import-not-at-top
      paths = [p if p.endswith(".json") else os.path.join(p, "report.json")
               for p in _COMPARE.value]
      print(report_lib.compare_reports(paths))
      return
    if not _WORKDIR.value:
      sys.exit("paraagent_jax.evaluate: error: --workdir is required")
    config = config_utils.load_config(_CONFIG.value or DEFAULT_CONFIG)
    run(config, os.path.abspath(_WORKDIR.value), _CHECKPOINT.value,
        transcripts=_TRANSCRIPTS.value)
  except (config_utils.ConfigError, ckpt_lib.CheckpointError, OSError) as e:
    sys.exit(f"paraagent_jax.evaluate: error: {' '.join(str(e).split())}")


if __name__ == "__main__":
  app.run(main)
