"""ParaAgent-JAX: parallel acting in open-world tool environments, in JAX.

One folder per layer; imports only point down (checked by ``lint-imports``,
pyproject.toml), from the entry points to the utilities:

  train evaluate export_hf serve  command-line entry points (flags, errors)
  dry_run cli                     the dry run; the shared flags
  trainer/                        stage loops, train state, resume
  evaluation/ coldstart/ data/    evaluations and reports; demonstrations;
  serving/                        SFT data; a policy behind the chat API
  rundir                          a run directory: lock, config, tokenizer,
                                  checkpoint -> model
  paraact/                        the ParaAct loop: protocol, rollout, policies
  learner/ sampling               losses, advantages, train step; the sampler
  models/                         Qwen3 (Flax NNX), HF conversion
  checkpoint tokenizer metrics sharding api_client interrupts
  config_utils checksums fileio   utilities, lowest last

``toolenv`` (the environment) is pure Python and imports nothing from here.
"""

__version__ = "0.1.0"

import os as _os

# transformers prints "PyTorch was not found. Models won't be available ..."
# on import when torch is absent; this project needs only its tokenizers and
# configs (and its own JAX models), so that advice is noise. Set
# TRANSFORMERS_NO_ADVISORY_WARNINGS= (empty) to see it.
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
