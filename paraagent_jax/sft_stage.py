"""What the SFT stage does around its training loop on ToolEnv data.

`paraagent_jax.train.run_sft` trains on whatever ``config.data.source``
yields. For the demonstrations source two things happen around that loop:

* before it, `ensure_demonstrations`: with ``data.data_dir`` empty, the
  cold-start demonstrations are built into ``WORKDIR/demos`` (once; a rerun
  reuses them), so that ``--config=configs/demo.py:stage=sft`` runs alone;
* after it, `greedy_eval`: with ``sft_eval_tasks`` > 0, the trained policy
  runs greedily through the ParaAct rollout on that many held-out ``test``
  tasks (kinds round robin, the RL stage's settings ``rl.*``); success per
  kind, multi-tool success and calls per execute step are printed and saved
  to ``WORKDIR/sft_eval.json``.
"""

from __future__ import annotations

import json
import os
import time

DEMOS_DIR = "demos"
EVAL_FILE = "sft_eval.json"


def ensure_demonstrations(config, workdir: str) -> None:
  """Points ``config.data.data_dir`` at built demonstrations (in place).

  Does nothing unless ``data.source`` is "demonstrations" and ``data_dir``
  is empty. Otherwise builds into ``WORKDIR/demos`` unless a finished build
  (its ``stats.json``, written last) is there already.
  """
  data = config.data
  if data.source != "demonstrations" or data.get("data_dir", ""):
    return
  out = os.path.join(workdir, DEMOS_DIR)
  if not os.path.exists(os.path.join(out, "stats.json")):
    from paraagent_jax.coldstart import build  # pylint: disable=g-import-not-at-top
    print(f"sft: data.data_dir is empty: building the demonstrations in {out}",
          flush=True)
    build.build_demonstrations(config, out)
  data.data_dir = out


def format_eval(result: dict[str, float]) -> str:
  """A small table: success per kind, overall, multi-tool, calls per step."""
  kinds = sorted(k[len("success_"):] for k in result
                 if k.startswith("success_") and k != "success_multi_tool")
  lines = [f"  {'kind':<12}success"]
  lines += [f"  {k:<12}{result['success_' + k]:.3f}" for k in kinds]
  lines.append(f"  {'overall':<12}{result.get('success', 0.0):.3f}")
  if "success_multi_tool" in result:
    lines.append(f"  {'multi-tool':<12}{result['success_multi_tool']:.3f}")
  lines.append(f"  mean turns {result.get('turns', 0.0):.2f}, calls per execute "
               f"step {result.get('calls_per_execute_step', 0.0):.2f}")
  return "\n".join(lines)


def greedy_eval(config, workdir: str, graphdef, state) -> dict[str, float]:
  """Greedy ParaAct success of the model on ``config.sft_eval_tasks`` test tasks."""
  # pylint: disable=g-import-not-at-top
  from flax import nnx
  import toolenv
  from paraagent_jax import rl_stage
  from paraagent_jax import tokenizer as tok_lib
  from paraagent_jax.paraact import chat_format, policies
  # pylint: enable=g-import-not-at-top
  rl = config.rl
  t0 = time.time()
  tok = tok_lib.load_tokenizer(rl_stage.tokenizer_path(config))
  fmt = chat_format.ChatFormat(tok, strategy=rl.strategy)
  catalog = toolenv.load_catalog(rl.catalog, seed=rl.catalog_seed)
  gen = toolenv.TaskGenerator(catalog, seed=rl.task_seed)
  kinds = [k for k in rl.kinds.split(",") if k]
  tasks = rl_stage.draw_tasks(gen, "test", 0, int(config.sft_eval_tasks), kinds)
  policy = policies.JaxPolicy(nnx.merge(graphdef, state), fmt, max_len=rl.max_len,
                              max_turn_tokens=rl.max_turn_tokens, temperature=0.0)
  result = rl_stage.greedy_eval(
      policy, fmt, catalog, tasks, rl_stage.rollout_config(rl), rl.strategy,
      obs_format=str(config.data.get("obs_format", "full")))
  result["num_tasks"] = len(tasks)
  result["eval_seconds"] = round(time.time() - t0, 1)
  print(f"sft: greedy ParaAct on {len(tasks)} held-out test tasks "
        f"({result['eval_seconds']:.0f}s):\n{format_eval(result)}", flush=True)
  with open(os.path.join(workdir, EVAL_FILE), "w") as f:
    json.dump(result, f, indent=1)
  return result
