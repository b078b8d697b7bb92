"""Exports a training workdir's Orbax checkpoint as a Hugging Face Qwen3 model.

Usage::

  python -m paraagent_jax.export_hf --workdir=/tmp/sft_tiny --out=/tmp/export
  python -m paraagent_jax.export_hf --workdir=W --step=200 --out=O \
      --push_to_hub=user/repo

The run config (``WORKDIR/config.json``, written by `paraagent_jax.train`)
gives the model architecture and the tokenizer; the weights come from
``WORKDIR/checkpoints/<step>`` (the latest step unless --step). The output is
`hf_io.save_hf`'s directory (loadable by ``AutoModelForCausalLM`` and, when the
run had a tokenizer, ``AutoTokenizer`` with the ParaAct chat template) plus a
README.md model card with the training config and any eval results found in
the workdir.
"""

import json
import os
import sys

from absl import app
from absl import flags
from absl import logging
from flax import nnx
import jax
import ml_collections

from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import config_utils
from paraagent_jax import sharding as shd
# train defines --workdir (shared with this tool) and the model derivation.
from paraagent_jax import train
from paraagent_jax.models import hf_io
from paraagent_jax.models import qwen3

_WORKDIR = train._WORKDIR  # pylint: disable=protected-access
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default latest).")
_OUT = flags.DEFINE_string("out", None, "Output HF directory.")
_PUSH = flags.DEFINE_string("push_to_hub", None, "Hub repo id (user/repo).")
_MAX_SHARD = flags.DEFINE_integer("max_shard_bytes", 2 * 1024 ** 3,
                                  "Largest safetensors shard.")

# Files in a workdir that hold evaluation results (written by the eval
# report, the RL stage and the pipeline's stage markers).
EVAL_FILES = ("report.json", "eval_report.json", "rl_eval.json", "DONE.json")


class ExportError(ValueError):
  """A workdir that cannot be exported (reported as one line)."""


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The run config a training workdir saved (``config.json``)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise ExportError(f"{workdir}: no config.json (not a training workdir)")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def tokenizer_dir(config) -> str:
  """The run's tokenizer directory, or "" if it had none (synthetic data)."""
  for p in (config.get("rl", {}).get("tokenizer", ""),
            config.data.get("tokenizer", "")):
    if p:
      return p
  for base in (config.data.get("data_dir", ""), config.get("init_from", "")):
    if base and os.path.isdir(os.path.join(base, "tokenizer")):
      return os.path.join(base, "tokenizer")
  if config.get("init_from", "") and os.path.isfile(
      os.path.join(config.init_from, "tokenizer.json")):
    return config.init_from
  return ""


def model_config(config, tokenizer=None) -> qwen3.Qwen3Config:
  """The architecture the run trained (same derivation as `train`)."""
  vocab = int(config.model.get("vocab_size", 0)) or (
      len(tokenizer) if tokenizer is not None else
      int(config.data.get("vocab_size", 0)))
  return train.model_config(config, vocab_size=vocab)


def restore_model(workdir: str, step: int | None, model_cfg: qwen3.Qwen3Config):
  """The model with the weights of checkpoint `step` (latest if None)."""
  path = workdir
  if step is not None:
    path = os.path.join(workdir, ckpt_lib.CHECKPOINT_SUBDIR, str(step))
    if not os.path.isdir(os.path.join(path, "model")):
      raise ExportError(f"{workdir}: no checkpoint for step {step}")
  found = ckpt_lib.find_checkpoint(path)
  if found is None:
    raise ExportError(f"{workdir}: no Orbax checkpoint")
  abstract_model = nnx.eval_shape(lambda: qwen3.Qwen3(model_cfg,
                                                      rngs=nnx.Rngs(0)))
  graphdef, abstract = nnx.split(abstract_model)
  mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1},
                       devices=jax.devices()[:1])
  state = ckpt_lib.restore_model_state(path, ckpt_lib.with_shardings(
      abstract, shd.param_shardings(abstract, mesh)))
  return nnx.merge(graphdef, state), found[1]


def eval_results(workdir: str) -> dict:
  """Eval/result JSON files found in `workdir`, by file name."""
  out = {}
  for name in EVAL_FILES:
    p = os.path.join(workdir, name)
    if os.path.isfile(p):
      try:
        with open(p) as f:
          out[name] = json.load(f)
      except json.JSONDecodeError:
        continue  # A half-written report is not worth failing the export.
  return out


def model_card(config, model_cfg, step: int, evals: dict, has_tok: bool) -> str:
  """README.md text: what was trained, how, and how well."""
  lines = [
      "---", "library_name: transformers", "tags: [paraagent-jax, qwen3]",
      "---", "", "# ParaAgent-JAX Qwen3 export", "",
      f"Exported from an Orbax checkpoint at step {step} "
      f"(stage `{config.get('stage', '?')}`).", "",
      "## Architecture", "", "```json",
      json.dumps(model_cfg.to_hf_dict(), indent=1), "```", "",
      "## Usage", "", "```python",
      "from transformers import AutoModelForCausalLM, AutoTokenizer",
      "model = AutoModelForCausalLM.from_pretrained(PATH)"]
  if has_tok:
    lines += ["tok = AutoTokenizer.from_pretrained(PATH)",
              "text = tok.apply_chat_template(messages, tokenize=False, "
              "add_generation_prompt=True)"]
  lines += ["```", "", "## Training config", "", "```json",
            json.dumps(config_utils.to_dict(config), indent=1, default=str),
            "```", ""]
  lines += ["## Evaluation", ""]
  if evals:
    for name, obj in evals.items():
      lines += [f"`{name}`:", "", "```json",
                json.dumps(obj, indent=1, default=str)[:20000], "```", ""]
  else:
    lines += ["No evaluation report was found in the workdir.", ""]
  return "\n".join(lines)


def push_to_hub(out_dir: str, repo_id: str) -> None:
  """Uploads `out_dir` to the Hub; a one-line error when that is impossible."""
  try:
    import huggingface_hub  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ExportError("--push_to_hub needs the huggingface_hub package") from None
  try:
    api = huggingface_hub.HfApi()
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(folder_path=out_dir, repo_id=repo_id)
  except (OSError, ValueError, RuntimeError) as e:
    raise ExportError(
        f"push_to_hub={repo_id} failed (offline or not logged in? the export "
        f"is in {out_dir}): {' '.join(str(e).split())[:300]}") from None


def export(workdir: str, out_dir: str, step: int | None = None,
           push_to_hub_repo: str | None = None,
           max_shard_bytes: int = 2 * 1024 ** 3) -> dict:
  """Library entry point: writes the HF directory; returns a summary dict."""
  from paraagent_jax import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  workdir = os.path.abspath(workdir)
  hint = ckpt_lib.pipeline_hint(workdir)
  if hint:
    raise ExportError(f"--workdir={workdir}: {hint}")
  config = load_run_config(workdir)
  tok_path = tokenizer_dir(config)
  tokenizer = tok_lib.load_tokenizer(tok_path) if tok_path else None
  model_cfg = model_config(config, tokenizer)
  model, step = restore_model(workdir, step, model_cfg)
  files = hf_io.save_hf(model, out_dir, tokenizer=tokenizer,
                        max_shard_bytes=max_shard_bytes)
  evals = eval_results(workdir)
  with open(os.path.join(out_dir, "README.md"), "w") as f:
    f.write(model_card(config, model_cfg, step, evals, tokenizer is not None))
  if push_to_hub_repo:
    push_to_hub(out_dir, push_to_hub_repo)
  return {"step": step, "files": files, "tokenizer": tok_path,
          "evals": sorted(evals)}


def main(argv) -> None:
  """Command line: one-line errors for bad input."""
  if len(argv) > 1:
    sys.exit(f"paraagent_jax.export_hf: error: unexpected arguments {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    # Orbax logs every file it reads at INFO; keep the console readable.
    logging.set_verbosity(logging.WARNING)
  if not _WORKDIR.value or not _OUT.value:
    sys.exit("paraagent_jax.export_hf: error: --workdir and --out are required")
  try:
    summary = export(_WORKDIR.value, _OUT.value, _STEP.value, _PUSH.value,
                     _MAX_SHARD.value)
  except (ExportError, ckpt_lib.CheckpointError, config_utils.ConfigError,
          OSError, ValueError, KeyError) as e:
    sys.exit(f"paraagent_jax.export_hf: error: {' '.join(str(e).split())}")
  print(f"exported step {summary['step']} to {_OUT.value}: "
        f"{', '.join(summary['files'])}", flush=True)


if __name__ == "__main__":
  app.run(main)
