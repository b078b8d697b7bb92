"""The held-out evaluator: the tasks of a spec, a greedy run, metrics and records."""

import pytest

import toolenv
from paraagent_jax.evaluation import heldout
from paraagent_jax.evaluation import suite
from paraagent_jax.paraact import chat_format, policies


@pytest.mark.slow
def test_oracle_solves_every_held_out_task_and_records_follow_task_order(tmp_path):
  spec = heldout.HeldOutSpec(num_tasks=10, kinds=("single", "parallel"))
  held = heldout.HeldOut(spec)
  # Test split, kinds round robin: what the RL stage and evaluate both draw.
  gen = toolenv.TaskGenerator(toolenv.load_catalog("procedural", seed=0), seed=0)
  assert [t.id for t in held.tasks] == [t.id for t in gen.generate(10, "test",
                                                                   ("single", "parallel"))]
  fmt = chat_format.ChatFormat(suite.text_policy_tokenizer(), strategy="paraact")
  policy = policies.OraclePolicy(fmt, strategy="paraact")
  ev = held.run(policy, fmt, batch_size=4, workdir=str(tmp_path), policy_name="oracle")
  assert ev.metrics["success"] == 1.0
  assert ev.metrics["success_single"] == ev.metrics["success_parallel"] == 1.0
  assert ev.metrics["success_multi_tool"] == 1.0          # parallel is multi-tool
  assert [r["task_id"] for r in ev.records] == [t.id for t in held.tasks]
  rec = heldout.paired_record(ev.records[0])
  assert list(rec)[:4] == ["task_id", "kind", "success", "turns"]
  assert rec["transcript"][0]["role"] == "task"
  # A rerun on the same workdir reads the records back instead of rolling out.
  logs = []
  again = held.with_strategy("paraact").run(policy, fmt, batch_size=4, workdir=str(tmp_path),
                                            policy_name="oracle", log=logs.append)
  assert logs == ["evaluate: toolenv/oracle/paraact: 10 recorded, 0 to go"]
  assert again.metrics == ev.metrics
