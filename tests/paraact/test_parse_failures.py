"""Parse failures are counted: per episode, per RL iteration, per evaluation.

A scripted policy writes known mistakes; the counts are worked out by hand.
"""

import toolenv
from toolenv.catalog import procedural
from paraagent_jax import tokenizer as T
from paraagent_jax.evaluation import report, runner
from paraagent_jax.paraact import chat_format, policies, protocol, rollout
from paraagent_jax.trainer import rl


class Scripted(policies.Policy):
  """Writes the same turns in every episode."""
  name = "scripted"

  def __init__(self, fmt, turns):
    self.fmt, self.turns, self.at = fmt, turns, {}

  def reset(self, num_episodes, tasks, seed=0):
    self.at = {i: 0 for i in range(num_episodes)}

  def act(self, requests):
    out = []
    for r in requests:
      text = self.turns[min(self.at[r.episode], len(self.turns) - 1)]
      self.at[r.episode] += 1
      ids = self.fmt.encode(text)
      out.append(policies.TurnOutput(ids, [0.0] * len(ids), text))
    return out


TURNS = [
    # one good search, one broken JSON, one not an object: 2 dropped, 1 JSON error
    '<explore> find\n<call>{"name": "search_tools", "arguments": {"query": "weather"}}</call>\n'
    '<call>{"name": "search_tools", "arguments": </call>\n<call>[1]</call>\n</step>',
    # a tool that does not exist: the environment answers unknown_tool
    '<execute> go\n<call>{"name": "no_such_tool_xyz", "arguments": {}}</call>\n</step>',
    "<answer> nothing </answer>",
]


def test_episodes_iterations_and_reports_count_parse_failures():
  cat = procedural.build_catalog(seed=0, size=500)
  tasks = toolenv.TaskGenerator(cat, seed=0).generate(2, "train")
  tok = T.train_bpe_tokenizer([protocol.system_prompt()] + TURNS * 3, vocab_size=400)
  fmt = chat_format.ChatFormat(tok, "paraact")
  env = toolenv.VectorToolEnv(cat, len(tasks), **toolenv.oracle.env_options("paraact"))
  res = rollout.run_rollout(Scripted(fmt, TURNS), env, tasks, fmt,
                            rollout.RolloutConfig(max_turns=4, max_len=4096))
  for rec in res.episodes:
    assert (rec["parse_errors"], rec["calls_dropped"], rec["json_errors"],
            rec["unknown_tool_calls"]) == (1, 2, 1, 1), rec
  totals = runner.parse_failures(res.episodes)
  assert totals == {"parse_errors": 2, "calls_dropped": 4, "json_errors": 2,
                    "unknown_tool_calls": 2}
  assert runner.parse_failure_text(totals) == (
      "parse failures 2 steps, 4 calls dropped (2 JSON errors), 2 unknown tools")
  m = rl.behaviour_metrics(res.episodes)
  assert (m["rollout/parse_failures"], m["rollout/calls_dropped"], m["rollout/json_errors"],
          m["rollout/unknown_tool_calls"]) == (2, 4, 2, 2)
  line = rl.iteration_line(1, 2, {**m, "rollout/success": 0.0, "rollout/traj_spread_groups": 0,
                                  "rollout/traj_reward": 0.0, "rollout/phase_reward": 0.0,
                                  "rollout/step_reward": 0.0, "time/iteration_s": 1.0}, 2)
  assert "parse 2/6 (dropped 4, json 2, unknown tools 2)" in line
  recs = [dict(r, benchmark="toolenv", strategy="paraact", policy="p") for r in res.episodes]
  rep = report.build_report(recs)
  overall = rep["runs"][0]["overall"]
  assert overall["parse_failure_totals"] == totals and overall["calls_dropped"] == 2.0
  table = report.markdown_table(rep, transcripts=False)
  assert "| calls dropped | JSON errors | unknown tools |" in table
