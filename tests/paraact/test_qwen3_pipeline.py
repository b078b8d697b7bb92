"""The qwen3 protocol format through the cold start, SFT rows and the whole runlocal pipeline.

References: HF ``apply_chat_template`` of each demonstration (the tokens a
Qwen3 model saw in pre-training) and transformers loading the exported
directory.
"""

import json
import os
import subprocess
import sys

import pytest

import toolenv
from toolenv.catalog import procedural
from paraagent_jax import tokenizer as T
from paraagent_jax.coldstart import orchestrator, roles
from paraagent_jax.data import rows
from paraagent_jax.models import tiny_qwen3
from paraagent_jax.paraact import chat_format, qwen3_format

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QWEN3 = chat_format.ProtocolSpec(format="qwen3")


def _demos(n=6, protocol_format="qwen3"):
  cat = procedural.build_catalog(seed=0, size=3000)
  tasks = toolenv.TaskGenerator(cat, seed=1).generate(n, "train")
  orch = orchestrator.Orchestrator(cat, roles.scripted_roles(cat, seed=0),
                                   protocol_format=protocol_format)
  kept, _ = orch.run(tasks)
  return [r["messages"] for r in kept]


def test_sft_rows_are_the_templates_tokens_with_the_loss_on_assistant_turns():
  tok = tiny_qwen3.train_tokenizer(tiny_qwen3.toolenv_texts(10), 600)
  demos = _demos()
  assert demos and all("tool_calls" in m for msgs in demos for m in msgs
                       if m["role"] == "assistant" and "<answer>" not in m["content"])
  encoded = rows.encode_conversations(tok, demos, QWEN3)
  tools = list(qwen3_format.META_TOOL_SCHEMAS)
  for msgs, (ids, mask) in zip(demos, encoded):
    want = tok.apply_chat_template(msgs, tools=tools, tokenize=False)
    assert ids.tolist() == tok.encode(want, add_special_tokens=False)
    # The loss covers exactly what each assistant turn writes and its <|im_end|>.
    learnt = tok.decode([i for i, m in zip(ids.tolist(), mask) if m],
                        skip_special_tokens=False)
    steps = [qwen3_format.render_step(qwen3_format.parse_step(m["content"] + "".join(
        f'\n<tool_call>\n{json.dumps(c["function"], ensure_ascii=False)}\n</tool_call>'
        for c in m.get("tool_calls", [])))) for m in msgs if m["role"] == "assistant"]
    assert learnt == "".join(s + T.IM_END for s in steps)
  # Tags demonstrations under qwen3 (and back) are refused in one line.
  with pytest.raises(rows.config_utils.ConfigError, match="rebuild them"):
    rows.encode_conversations(tok, _demos(2, "tags"), QWEN3)
  with pytest.raises(rows.config_utils.ConfigError, match="rebuild them"):
    rows.encode_conversations(tok, demos, None)


def _run(cwd, module, *args):
  p = subprocess.run([sys.executable, "-m", f"paraagent_jax.{module}", *args], cwd=cwd,
                     capture_output=True, text=True, timeout=2400)
  assert p.returncode == 0, (module, p.stdout[-2000:], p.stderr[-3000:])
  return p.stdout + p.stderr


@pytest.mark.slow
def test_runlocal_pipeline_evaluate_and_export_in_the_qwen3_format(tmp_path):
  hf = tiny_qwen3.make_tiny_qwen3(str(tmp_path / "qwen3"))
  work = str(tmp_path / "w")
  out = _run(ROOT, "train", "--config=configs/demo.py:runlocal,from_scratch=True",
             "--config.protocol.format=qwen3", f"--config.init_from={hf}",
             f"--config.data.tokenizer={hf}", f"--workdir={work}")
  assert "pipeline: done" in out and "rl: it 2/2" in out
  with open(os.path.join(work, "demos", "demonstrations_train.jsonl")) as f:
    demo = json.loads(f.readline())
  assert any(m.get("tool_calls") for m in demo["messages"])
  assert "<tool_call>" not in json.dumps(demo["messages"][2:])    # structured, not text
  with open(os.path.join(work, "rl", "rl_run.json")) as f:
    assert json.load(f)["protocol"] == "qwen3"
  out = _run(ROOT, "evaluate", "--config=configs/evaluate.py:runlocal",
             "--config.protocol.format=qwen3", "--config.strategies=paraact",
             f"--workdir={work}/eval", f"--checkpoint={work}/rl")
  assert "toolenv-procedural/rl/paraact: 10/10 tasks" in out
  _run(ROOT, "export_hf", f"--workdir={work}/rl", f"--out={work}/hf")
  import transformers  # pylint: disable=g-import-not-at-top
  exported = transformers.AutoTokenizer.from_pretrained(f"{work}/hf")
  assert exported.chat_template == tiny_qwen3.QWEN3_STYLE_TEMPLATE
  model = transformers.AutoModelForCausalLM.from_pretrained(f"{work}/hf")
  assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2


def test_protocol_config_errors_are_one_line(tmp_path):
  from configs import evaluate as evaluate_config  # pylint: disable=g-import-not-at-top
  from paraagent_jax import config_utils  # pylint: disable=g-import-not-at-top
  from paraagent_jax.evaluation import suite  # pylint: disable=g-import-not-at-top
  from paraagent_jax.trainer import specs  # pylint: disable=g-import-not-at-top
  c = config_utils.train_defaults()
  assert specs.protocol_spec(c) == chat_format.ProtocolSpec("tags", "")
  for key, value, match in (("format", "qwen4", r"protocol: unknown protocol format 'qwen4'"),
                            ("chat_template", str(tmp_path / "t.jinja"),
                             "read by the qwen3 format only")):
    c = config_utils.train_defaults()
    c.protocol[key] = value
    with pytest.raises(config_utils.ConfigError, match=match) as e:
      specs.protocol_spec(c)
    assert "\n" not in str(e.value)
  c.protocol.format = "qwen3"
  with pytest.raises(config_utils.ConfigError, match="t.jinja: no such file"):
    specs.protocol_spec(c)
  # evaluate refuses a workdir trained in the other format, naming the flag.
  work = tmp_path / "run"
  work.mkdir()
  (work / "config.json").write_text(json.dumps({"protocol": {"format": "qwen3"}}))
  ev = evaluate_config.get_config("runlocal")
  with pytest.raises(config_utils.ConfigError, match="--config.protocol.format=qwen3"):
    suite.protocol_spec(ev, str(work))
  ev.protocol.format = "qwen3"
  assert suite.protocol_spec(ev, str(work)).format == "qwen3"
