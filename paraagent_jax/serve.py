r"""Serve a trained policy behind an OpenAI-compatible endpoint (CPU or one device).

    python -m paraagent_jax.serve --checkpoint=pretrained/demo_sft --port=8000
    curl http://127.0.0.1:8000/v1/models

``--checkpoint`` is an exported Hugging Face directory (`paraagent_jax.export_hf`
writes one; ``pretrained/demo_sft`` is one) or a training workdir. The server
answers ``POST /v1/chat/completions`` with ``tool_calls`` (greedy; the
model's own protocol output parsed by the project's parser) and ``GET
/v1/models``; `paraagent_jax.serving.policy_server` says how a request's
messages become the tokens the in-process rollout would have given the
model. Evaluate it with the same API policy as any API model
(docs/evaluation.md, "API models and served checkpoints"):

    python -m paraagent_jax.evaluate --workdir=/tmp/eval_served --config="configs/evaluate.py:\
policy=api,policy_name=demo_sft_served,api.base_url=http://127.0.0.1:8000/v1,api.model=demo_sft,\
tokenizer=pretrained/demo_sft,text_max_len=0,api.max_obs_tokens=640,api.max_tokens=256,\
strategies=paraact"

On a GPU, vLLM or SGLang serve the same directory (docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import os
import sys

from paraagent_jax import config_utils
from paraagent_jax import rundir
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.serving import openai_http
from paraagent_jax.serving import policy_server

PROG = "paraagent_jax.serve"


def parse_args(argv):
  """The command line (argparse: one-line errors, exit code 2)."""
  p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", required=True,
                 help="exported HF directory or training workdir")
  p.add_argument("--port", type=int, default=8000, help="0 = a free port")
  p.add_argument("--host", default="127.0.0.1")
  p.add_argument("--model_name", default="",
                 help="the model id of /v1/models (default: the directory's name)")
  p.add_argument("--strategy", default="paraact",
                 help="the strategy the model was trained in (its system prompt)")
  p.add_argument("--protocol_format", default="tags", help="tags | qwen3")
  p.add_argument("--max_len", type=int, default=2048, help="tokens per episode")
  p.add_argument("--max_turn_tokens", type=int, default=256,
                 help="tokens per turn when a request sets no max_tokens")
  return p.parse_args(argv)


def build(args) -> openai_http.ChatHTTPServer:
  """The server of ``args`` (not started).

  Raises:
    config_utils.ConfigError: no such checkpoint, no tokenizer, bad options.
  """
  path = args.checkpoint
  tok_dir = next((d for d in (path, os.path.join(path, "tokenizer"))
                  if os.path.isfile(os.path.join(d, "tokenizer.json"))), None)
  if tok_dir is None and os.path.isdir(path) and not rundir.is_hf_dir(path):
    tok_dir = rundir.tokenizer_dir(rundir.load_run_config(path))
  if tok_dir is None or not os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
    raise config_utils.ConfigError(f"--checkpoint={path}: no tokenizer.json in it")
  if args.max_len <= 0 or args.max_turn_tokens <= 0:
    raise config_utils.ConfigError("--max_len and --max_turn_tokens must be positive")
  tok = tok_lib.load_tokenizer(tok_dir)
  model = rundir.load_model(path, len(tok))[0]
  try:
    served = policy_server.ServedPolicy(
        model, tok, strategy=args.strategy, protocol_format=args.protocol_format,
        max_len=args.max_len, max_turn_tokens=args.max_turn_tokens)
  except ValueError as e:
    raise config_utils.ConfigError(str(e)) from None
  name = args.model_name or os.path.basename(os.path.normpath(path))
  return openai_http.ChatHTTPServer(served.respond, model=name, host=args.host,
                                    port=args.port)


def main(argv=None) -> None:
  """Builds the server, prints its address, serves until interrupted."""
  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    server = build(args)
  except (config_utils.ConfigError, OSError) as e:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"{PROG}: {server.model} at {server.base_url} (POST /chat/completions, "
        "GET /models); Ctrl-C stops", flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    # serve_forever has closed the socket; the port is free again.
    print(f"{PROG}: stopped", flush=True)


if __name__ == "__main__":
  main()
