"""Orbax training workdir -> HF directory, checked with transformers.

One tiny SFT run (configs/sft_tiny.py, runlocal: 8 steps) is exported; the
exported directory is loaded by AutoModelForCausalLM / AutoTokenizer and
compared with the model restored from the checkpoint.
"""

import json
import os
import subprocess
import sys

from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from paraagent_jax import rundir
from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import config_utils
from paraagent_jax import export_hf
from paraagent_jax import sampling
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax import train
from paraagent_jax.models import qwen3

# Slow as a whole: every test needs a trained workdir (a module fixture).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "sft_tiny.py")
ARGS = "runlocal,progress=False,tensorboard=False,eval_every=0"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("sft"))
  train.run(config_utils.load_config(f"{TINY}:{ARGS}"), d)
  return d


def restored(workdir):
  """Our model from the last checkpoint, restored independently of export."""
  config = config_utils.load_config(f"{TINY}:{ARGS}")
  cfg = rundir.model_config(config)
  abstract = nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  root, step = ckpt_lib.find_checkpoint(workdir)
  del root
  return nnx.merge(graphdef, ckpt_lib.restore_model_state(workdir, state)), step


def test_export_matches_our_model_in_transformers(workdir, tmp_path):
  out = str(tmp_path / "hf")
  summary = export_hf.export(workdir, out)
  ours, step = restored(workdir)
  assert summary["step"] == step == 8
  readme = open(os.path.join(out, "README.md")).read()
  assert "step 8" in readme and '"total_steps": 8' in readme
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      out, local_files_only=True).eval()
  assert hf.config.vocab_size == 64
  rng = np.random.RandomState(0)
  ids = rng.randint(0, 64, (2, 12))
  mask = np.ones_like(ids)
  mask[1, :5] = 0
  with torch.no_grad():
    ref = hf(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  got = np.asarray(ours(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
  real = mask.astype(bool)
  np.testing.assert_allclose(got[real], ref[real], atol=1e-4, rtol=0)
  # Trained weights, not the init: the copy task is partly learnt.
  assert np.abs(ref[real]).max() > 0.1
  prompt = [3, 9, 14, 20, 7]
  gen = sampling.generate(ours, [prompt], max_new_tokens=6, temperature=0.0)
  with torch.no_grad():
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=6,
                       do_sample=False, eos_token_id=None, pad_token_id=0,
                       attention_mask=torch.ones(1, 5, dtype=torch.long))
  assert list(np.asarray(gen.tokens)[0, :6]) == want[0, 5:].tolist()


def test_tokenizer_chat_template_and_eval_in_card(workdir, tmp_path):
  tok_dir = str(tmp_path / "tok")
  tok_lib.train_bpe_tokenizer(
      ["hello world, call the tool and read the response"] * 20,
      vocab_size=400, out_dir=tok_dir)
  cfg_path = os.path.join(workdir, "config.json")
  saved = json.load(open(cfg_path))
  try:
    patched = json.loads(json.dumps(saved))
    patched["data"]["tokenizer"] = tok_dir
    json.dump(patched, open(cfg_path, "w"))
    json.dump({"success_rate": 0.625}, open(os.path.join(workdir,
                                                         "rl_eval.json"), "w"))
    out = str(tmp_path / "hf")
    export_hf.export(workdir, out, step=4)
  finally:
    json.dump(saved, open(cfg_path, "w"))
    os.remove(os.path.join(workdir, "rl_eval.json"))
  assert "0.625" in open(os.path.join(out, "README.md")).read()
  assert "step 4" in open(os.path.join(out, "README.md")).read()
  tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
  messages = [{"role": "system", "content": "sys"},
              {"role": "user", "content": "hi"},
              {"role": "assistant", "content": "calling"},
              {"role": "tool", "content": "r1"},
              {"role": "tool", "content": "r2"},
              {"role": "assistant", "content": "done"}]
  for gen_prompt in (False, True):
    text = tok.apply_chat_template(messages, tokenize=False,
                                   add_generation_prompt=gen_prompt)
    assert text == tok_lib.render_messages(messages, gen_prompt)
  gen_cfg = json.load(open(os.path.join(out, "generation_config.json")))
  # Generation stops at the end of a turn or of the text.
  assert gen_cfg["eos_token_id"] == [tok.convert_tokens_to_ids("<|im_end|>"),
                                     tok.convert_tokens_to_ids("<|endoftext|>")]


def test_bad_workdir_and_step_are_refused(workdir, tmp_path):
  with pytest.raises(config_utils.ConfigError, match="no config.json"):
    export_hf.export(str(tmp_path), str(tmp_path / "o"))
  with pytest.raises(config_utils.ConfigError,
                     match=r"no checkpoint for step 999; saved steps: \d+"):
    export_hf.export(workdir, str(tmp_path / "o"), step=999)


def test_cli_push_to_hub_offline_is_one_line(workdir, tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             HF_HUB_OFFLINE="1")
  env.pop("XLA_FLAGS", None)
  p = subprocess.run([sys.executable, "-m", "paraagent_jax.export_hf",
                      f"--workdir={workdir}", f"--out={tmp_path / 'o'}",
                      "--push_to_hub=someone/repo"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=120)
  assert p.returncode != 0
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("paraagent_jax.export_hf: error: push_to_hub="
                         "someone/repo failed"), p.stderr[-2000:]
  # The local export is kept even though the push failed.
  assert os.path.isfile(os.path.join(tmp_path, "o", "model.safetensors"))
