"""Greedy transcripts of an SFT checkpoint on a few test (or train) tasks.

  python scripts/sft_diagnose.py --workdir=/tmp/demo_run/sft --split=test --n=10

Prints success per kind and, per episode, the decoded policy turns and the
observations, so one can see which step fails (tool name, id, answer).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flax import nnx  # noqa: E402  pylint: disable=wrong-import-position
import ml_collections  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import checkpoint as ckpt_lib  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import rundir  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import sharding as shd  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import tokenizer as tok_lib  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.evaluation import heldout  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.paraact import chat_format, policies, rollout  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.trainer import rl_tasks  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.trainer import specs  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.trainer import state as state_lib  # noqa: E402  pylint: disable=wrong-import-position
import toolenv  # noqa: E402  pylint: disable=wrong-import-position


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--split", default="test")
  ap.add_argument("--n", type=int, default=10)
  ap.add_argument("--start", type=int, default=0)
  ap.add_argument("--show", type=int, default=5)
  ap.add_argument("--max_chars", type=int, default=600)
  args = ap.parse_args()
  with open(os.path.join(args.workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  if not config.data.get("data_dir", ""):   # stage=sft alone: WORKDIR/demos
    config.data.data_dir = os.path.join(args.workdir, "demos")
  tok = tok_lib.load_tokenizer(rundir.tokenizer_dir(config))
  mcfg = rundir.model_config(config, vocab_size=len(tok))
  mesh = shd.make_mesh({"data": 1, "fsdp": -1, "tensor": 1})
  graphdef, abstract, shardings = state_lib.abstract_model(mcfg, mesh, shd.as_rules(None))
  state = ckpt_lib.restore_model_state(args.workdir,
                                       ckpt_lib.with_shardings(abstract, shardings))
  rl = config.rl
  fmt = chat_format.ChatFormat(tok, strategy=rl.strategy)
  catalog = toolenv.load_catalog(specs.rl_catalog(config), seed=rl.catalog_seed)
  gen = toolenv.TaskGenerator(catalog, seed=rl.task_seed)
  kinds = [k for k in rl.kinds.split(",") if k]
  tasks = rl_tasks.draw_tasks(gen, args.split, args.start, args.n, kinds)
  policy = policies.JaxPolicy(nnx.merge(graphdef, state), fmt, max_len=rl.max_len,
                              max_turn_tokens=rl.max_turn_tokens, temperature=0.0)
  env = toolenv.VectorToolEnv(catalog, num_envs=len(tasks),
                              obs_format=str(config.data.get("obs_format", "full")),
                              **toolenv.oracle.env_options(rl.strategy))
  res = rollout.run_rollout(policy, env, tasks, fmt, specs.rollout_limits(rl))
  print(json.dumps(heldout.summarize([{**e, "kind": t.kind} for t, e in zip(tasks, res.episodes)])))
  for i in range(min(args.show, len(tasks))):
    buf = res.buffers[i]
    print("=" * 30, tasks[i].kind, "success", res.episodes[i]["success"])
    text = tok.decode(list(buf.tokens), skip_special_tokens=False)
    print(text[:20000])


if __name__ == "__main__":
  main()
