"""An evaluation suite: policies x strategies x benchmarks -> records -> report.

`run(config, workdir, checkpoint)` is what ``python -m paraagent_jax.evaluate``
runs (see that module for the command line): it builds the policy
(``checkpoint``: a trained model; ``oracle``: the scripted upper bound through
the text protocol; ``api``: an OpenAI-compatible endpoint), runs every
(strategy, benchmark) of the config through `evaluation.runner` /
`evaluation.benchmarks` (per-task records appended as they finish, so a killed
evaluation resumes) and writes ``report.md``, ``report.json`` and the PNG
plots (`evaluation.report`).
"""

from __future__ import annotations

import dataclasses
import os

import toolenv
from paraagent_jax import api_client
from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import rundir
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.evaluation import benchmarks as bench_lib
from paraagent_jax.evaluation import causes as causes_lib
from paraagent_jax.evaluation import heldout
from paraagent_jax.evaluation import report as report_lib
from paraagent_jax.paraact import api_policy, chat_format, policies, rollout
from paraagent_jax.paraact import strategies as strategy_lib


_TEXT_TOKENIZER: list = []


def text_policy_tokenizer(workdir: str = ""):
  """A BPE for text-level policies (oracle, API), which bring no tokenizer.

  Their token counts only set budgets (max_len) and the tokens reported, so
  it is trained on what episodes contain: the strategies' system prompts and
  scripted episodes of ToolEnv train tasks (never the test split). Saved in
  ``workdir/text_tokenizer`` so a resumed evaluation counts the same tokens.
  """
  out = os.path.join(workdir, "text_tokenizer") if workdir else None
  if out and fileio.exists(os.path.join(out, "tokenizer.json")):
    return tok_lib.load_tokenizer(out)
  if _TEXT_TOKENIZER:
    # Same texts give the same BPE: reuse this process's (tests, several runs).
    tok = _TEXT_TOKENIZER[0]
    if out:
      tok_lib.save_tokenizer(tok, out)
    return tok
  texts = [strategy_lib.get_strategy(s).system_prompt() for s in strategy_lib.STRATEGY_NAMES]
  gen = toolenv.TaskGenerator(toolenv.load_catalog("procedural", seed=0), seed=1)
  for t in gen.generate(100, split="train"):
    texts.append(t.instruction)
    for s in ("paraact", "react"):
      texts += [strategy_lib.get_strategy(s).render_step(x) for x in toolenv.oracle.solve(t, s)]
  tok = tok_lib.train_bpe_tokenizer(texts, vocab_size=2048, out_dir=out)
  _TEXT_TOKENIZER.append(tok)
  return tok


def rollout_limits(config):
  """The rollout limits `run` uses for ``config.policy``: ``config.rollout``,
  with ``max_len`` raised to ``config.text_max_len`` for the text-level
  policies (oracle, api), which hold no KV cache: their context is the
  endpoint's, and BFCL's closed prompts (tens of function docs) or a mixed
  task's whole observations outgrow a demo model's budget. An API model's
  observations are cut at ``config.api.max_obs_tokens`` (0: whole)."""
  try:
    rcfg = config_utils.config_from_mapping(rollout.RolloutConfig, config.rollout)
  except (TypeError, ValueError) as e:
    raise config_utils.ConfigError(f"rollout: {e}") from None
  if config.policy in ("oracle", "api"):
    rcfg = dataclasses.replace(rcfg, max_len=max(rcfg.max_len, config.text_max_len))
  if config.policy == "api":
    rcfg = dataclasses.replace(rcfg, max_obs_tokens=config.api.max_obs_tokens)
  return rcfg


def policy_tokenizer(config, checkpoint: str, workdir: str = ""):
  """The policy's tokenizer: config, checkpoint dir, or a small BPE for the oracle."""
  cands = [config.tokenizer]
  if checkpoint:
    cands += [checkpoint, os.path.join(checkpoint, "tokenizer")]
    if not rundir.is_hf_dir(checkpoint) and fileio.isfile(
        os.path.join(checkpoint, rundir.CONFIG_FILE)):
      # A training workdir: its run's tokenizer (an unreadable config.json is
      # a one-line ConfigError here, as it would be when loading the model).
      cands.append(rundir.tokenizer_dir(rundir.load_run_config(checkpoint)))
  for c in cands:
    if c and fileio.exists(os.path.join(c, "tokenizer.json")):
      return tok_lib.load_tokenizer(c)
  if config.policy in ("oracle", "api"):
    return text_policy_tokenizer(workdir)
  raise config_utils.ConfigError("no tokenizer found: set tokenizer=PATH (a directory "
                                 "with tokenizer.json)")


def api_policy_from_config(api, fmt, catalog=None, seed: int | None = None):
  """The API policy of ``config.api`` (base_url, model, api_key_env,
  tool_calling, strict_tools, timeout_s, max_retries, concurrency, max_tokens) for
  ``fmt``'s strategy."""
  client = api_client.make_client(api.base_url, api.api_key_env, timeout_s=api.timeout_s,
                                  max_retries=api.max_retries)
  chat = api_client.ChatModel(client, model=api.model, seed=seed,
                              max_tokens=api.max_tokens or None)
  return api_policy.APIPolicy(fmt, chat, catalog=catalog, tool_calling=api.tool_calling,
                              strict_tools=api.strict_tools, concurrency=api.concurrency)


def api_stats_line(model: str, strategy: str, stats: dict) -> str:
  """One console line of an API policy's requests and malformed tool calls."""
  return f"api {model} ({strategy}): " + ", ".join(
      f"{k.removeprefix('api_').replace('_', ' ')} {v}" for k, v in stats.items())


def protocol_spec(config, checkpoint: str = "") -> chat_format.ProtocolSpec:
  """``config.protocol`` (the checkpoint's turn format; tags when absent).

  Raises:
    ConfigError: a bad value, or a training workdir whose run wrote its turns
      in another format (its config.json says which).
  """
  protocol = config.get("protocol") or {}
  try:
    spec = chat_format.ProtocolSpec.checked(protocol.get("format", "tags"),
                                            protocol.get("chat_template", ""))
  except ValueError as e:
    raise config_utils.ConfigError(f"protocol: {e}") from None
  if checkpoint and not rundir.is_hf_dir(checkpoint) and fileio.isfile(
      os.path.join(checkpoint, rundir.CONFIG_FILE)):
    trained = (rundir.load_run_config(checkpoint).get("protocol") or {}).get("format", "tags")
    if trained != spec.format:
      raise config_utils.ConfigError(
          f"--checkpoint={checkpoint} was trained with protocol.format={trained}; "
          f"evaluate it with --config.protocol.format={trained}")
  return spec


def run(config, workdir: str, checkpoint: str = "", transcripts: int = 0,
        step: int | None = None) -> dict:
  """Runs every (strategy, benchmark) of ``config``; writes and returns the report.

  ``step``: the checkpoint step of a training workdir (default: the newest).
  """
  if checkpoint:
    config.policy = "checkpoint"
  if config.policy not in ("oracle", "checkpoint", "api"):
    raise config_utils.ConfigError(f"policy={config.policy!r}; expected oracle, "
                                   "checkpoint or api")
  if config.policy == "checkpoint" and not checkpoint:
    raise config_utils.ConfigError("policy=checkpoint needs --checkpoint=DIR")
  if checkpoint and not fileio.exists(checkpoint):
    raise config_utils.ConfigError(f"--checkpoint={checkpoint}: no such directory")
  if checkpoint:
    hint = ckpt_lib.pipeline_hint(checkpoint)
    if hint:
      raise config_utils.ConfigError(f"--checkpoint={checkpoint}: {hint}")
    if not fileio.isdir(checkpoint) or not (
        rundir.is_hf_dir(checkpoint) or ckpt_lib.find_checkpoint(checkpoint)):
      raise config_utils.ConfigError(
          f"--checkpoint={checkpoint}: neither a Hugging Face model directory "
          "(config.json and *.safetensors) nor a training workdir (checkpoints/STEP "
          "and its config.json)")
  known = ("toolenv", "bfcl", "stabletoolbench")
  for bench in config_utils.parse_list(config.benchmarks):
    if bench not in known:
      raise config_utils.ConfigError(f"benchmarks: unknown {bench!r}; expected one of "
                                     f"{', '.join(known)}")
  created = not fileio.exists(workdir)
  fileio.makedirs(workdir)
  try:
    return _run(config, workdir, checkpoint, transcripts, step)
  except BaseException:
    # A run that failed before writing anything leaves no empty workdir behind
    # (on a bucket there is none: a folder is only the objects under it).
    if created and fileio.isdir(workdir) and not fileio.listdir(workdir):
      fileio.rmtree(workdir)
    raise


def _run(config, workdir: str, checkpoint: str, transcripts: int, step: int | None) -> dict:
  """`run` after its checks, in the existing ``workdir``."""
  tok = policy_tokenizer(config, checkpoint, workdir)
  model = rundir.load_model(checkpoint, len(tok), step)[0] if checkpoint else None
  # normpath only to take the last name: "gs://b/run/" gives "run" all the same.
  name = config.policy_name or (os.path.basename(os.path.normpath(checkpoint))
                                if checkpoint else config.policy)
  if step is not None and not config.policy_name:
    name += f"@{step}"
  rcfg = rollout_limits(config)

  protocol = protocol_spec(config, checkpoint)

  def fmt_for(strategy):
    return protocol.chat_format(tok, strategy)

  api_policies = []

  def make_policy(strategy, plan_fn=None, catalog=None):
    fmt = fmt_for(strategy)
    if config.policy == "oracle":
      if plan_fn is not None:
        return bench_lib.PlanOraclePolicy(fmt, plan_fn, strategy=strategy)
      return policies.OraclePolicy(fmt, strategy=strategy)
    if config.policy == "api":
      policy = api_policy_from_config(config.api, fmt, catalog, seed=config.seed)
      api_policies.append((strategy, policy))
      return policy
    return policies.JaxPolicy(model, fmt, max_len=rcfg.max_len,
                              max_turn_tokens=rcfg.max_turn_tokens, temperature=0.0)

  records = []
  benchmarks = config_utils.parse_list(config.benchmarks)
  strategies = config_utils.parse_list(config.strategies)
  common = dict(strategies=strategies, policy_name=name, workdir=workdir,
                rollout_config=rcfg, batch_size=config.batch_size, seed=config.seed)
  for bench in benchmarks:
    if bench == "toolenv":
      kinds = tuple(config_utils.parse_list(config.kinds))
      for cat_name in config_utils.parse_list(config.catalog):
        spec = heldout.HeldOutSpec(
            catalog=cat_name, catalog_seed=config.catalog_seed, task_seed=config.task_seed,
            kinds=kinds, num_tasks=config.num_per_kind * len(kinds), limits=rcfg,
            seed=config.seed)
        try:
          held = heldout.HeldOut(spec)
        except ValueError as e:
          raise config_utils.ConfigError(f"toolenv-{cat_name}: {e}") from e
        for strategy in strategies:
          records += held.with_strategy(strategy).run(
              make_policy(strategy, catalog=held.catalog), fmt_for(strategy),
              batch_size=config.batch_size,
              workdir=workdir, policy_name=name, benchmark=f"toolenv-{cat_name}",
              fields={"catalog": held.catalog.name}, log=print).records
    elif bench == "bfcl":
      try:
        entries = bench_lib.bfcl_entries(
            config.bfcl_source, config_utils.parse_list(config.bfcl_categories),
            limit=config.bfcl_limit)
      except (FileNotFoundError, ValueError) as e:
        raise config_utils.ConfigError(f"bfcl: {e}") from e
      records += bench_lib.run_bfcl(
          make_policy, fmt_for, entries,
          settings=config_utils.parse_list(config.bfcl_settings), **common)
    elif bench == "stabletoolbench":
      if not (config.stb_queries and config.stb_tools):
        raise config_utils.ConfigError(
            "stabletoolbench: set stb_queries=FILE[;FILE...] (StableToolBench query "
            "JSON) and stb_tools=DIR (its tools directory)")
      try:
        records += bench_lib.run_stabletoolbench(
            make_policy, fmt_for, config_utils.parse_list(config.stb_queries, sep=";"),
            config.stb_tools, settings=config_utils.parse_list(config.stb_settings),
            limit=config.stb_limit, **common)
      except (FileNotFoundError, ValueError) as e:
        raise config_utils.ConfigError(f"stabletoolbench: {e}") from e
    else:
      raise config_utils.ConfigError(f"benchmarks: unknown {bench!r}; expected "
                                     "toolenv, bfcl or stabletoolbench")
  rep = report_lib.write_report(records, workdir)
  report = report_lib.build_report(records)
  print(report_lib.terminal_table(report), flush=True)
  for run in report["runs"]:
    if run.get("analysis"):
      print(f"failed episodes by cause, {run['benchmark']}/{run['policy']}/{run['strategy']}: "
            f"{causes_lib.one_line(run['analysis'])}; multi-tool: "
            f"{causes_lib.one_line(run['analysis'], 'multi_tool')}", flush=True)
  for strategy, policy in api_policies:
    print(api_stats_line(config.api.model, strategy, policy.stats()), flush=True)
  for ex in report["transcripts"][:max(0, int(transcripts))]:
    print(report_lib.format_transcript(ex, max_chars=0) + "\n", flush=True)
  pngs = [os.path.basename(v) for k, v in rep.items() if k.startswith("plot_")]
  print(f"evaluate: report {rep['markdown']} (every column, per-kind turns and "
        f"calls, example transcripts), "
        f"{rep['json']}; plots {', '.join(pngs)} in {workdir}; "
        f"per-task records with transcripts in {workdir}/records",
        flush=True)
  return rep
