#!/usr/bin/env bash
# One prepared check of an NVIDIA GPU, at most 8 minutes (budget 470 s) on one H200:
#   1. attention parity: logits of a random Qwen3 (0.6B shape, 4 layers) through
#      model.attention = auto / chunked / xla / cudnn vs "reference", fp32 and bf16;
#   2. one SFT and one RL (GRPO) step of a Qwen3-0.6B-shaped model, random weights,
#      bf16 compute: tokens/s and model FLOPs utilisation (MFU);
#   3. benchmarks/sampler_bench.py: our sampler on the GPU, against transformers
#      generate on torch CUDA when torch has CUDA, else our side only.
# Each step runs under `timeout`; a final table gives each step's status and figures.
# Without a GPU it prints one line and exits 0. Exit 1 if a step fails or times out.
#
#   bash benchmarks/device_check.sh
#   PYTHON=.venv/bin/python bash benchmarks/device_check.sh
#   TRAIN_ARGS="--batch=4 --seq=4096" bash benchmarks/device_check.sh   # extra flags per step
#
# Environment: PYTHON (default python3), DEVICE_CHECK_BUDGET_S (470), DEVICE_CHECK_LOGS
# (a directory for the logs; default a new temporary one), ATTENTION_ARGS, TRAIN_ARGS,
# SAMPLER_ARGS (appended to the flags of benchmarks/device_check.py attention / train
# and benchmarks/sampler_bench.py; a later flag wins), DEVICE_CHECK_ANY_BACKEND=1 (run
# the steps without a GPU too: with tiny shapes in *_ARGS, a smoke test of this script),
# DEVICE_CHECK_STEPS (default attention,train,sampler: the steps to run, e.g. to rerun one).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
BUDGET_S="${DEVICE_CHECK_BUDGET_S:-470}"

# The accelerator as JAX sees it; nothing heavier than jax is imported.
if ! info="$(timeout 60 "$PY" -c '
import jax
print(jax.default_backend(), jax.device_count(), jax.__version__,
      jax.devices()[0].device_kind, sep="\t")')"; then
  echo "device_check: could not import jax with $PY (set PYTHON=...)" >&2
  exit 1
fi
IFS=$'\t' read -r backend ndev jax_version kind <<<"$info"
if [ "$backend" != "gpu" ] && [ "${DEVICE_CHECK_ANY_BACKEND:-0}" != "1" ]; then
  echo "no GPU: jax backend is $backend; nothing to check"
  if [ "$backend" = "cpu" ] && command -v nvidia-smi >/dev/null 2>&1; then
    echo "(nvidia-smi is here: install the CUDA build of JAX, pip install -U \"jax[cuda12]\")"
  fi
  exit 0
fi

LOGS="${DEVICE_CHECK_LOGS:-$(mktemp -d -t device_check.XXXXXX)}"
mkdir -p "$LOGS"
echo "device_check: $ndev x $kind, jax $jax_version, budget ${BUDGET_S}s, logs in $LOGS"
# The versions the steps will import (a machine's image may hold other versions than
# the ones this project is tested with: see docs/gpu.md); "missing" if not installed
# (tokamax is optional: requirements-tokamax.txt).
timeout 60 "$PY" -c '
from importlib import metadata
names = ("jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "ml-collections",
         "tensorflow-datasets", "transformers", "torch", "numpy", "tokamax")
def version(name):
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return "missing"
print("device_check: versions:", ", ".join(f"{n} {version(n)}" for n in names))' \
  | tee "$LOGS/versions.log" || true

names=()
states=()
took=()
limits=()
notes=()

# run_step NAME LIMIT_S CMD...: runs CMD under timeout (clipped to the budget left),
# logs to $LOGS/NAME.log, records the status; never exits the script.
run_step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((BUDGET_S - SECONDS - 10))
  if [ "$left" -lt 30 ]; then
    names+=("$name"); states+=("SKIPPED (budget spent)"); took+=(0); limits+=("$limit")
    return 0
  fi
  if [ "$limit" -gt "$left" ]; then
    limit="$left"
  fi
  local start=$SECONDS rc=0
  echo
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log" || rc=$?
  local state="ok"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    state="TIMEOUT"
  elif [ "$rc" -ne 0 ]; then
    state="FAIL (exit $rc)"
  fi
  names+=("$name"); states+=("$state"); took+=("$((SECONDS - start))"); limits+=("$limit")
}

# want STEP: whether DEVICE_CHECK_STEPS selects STEP.
want() {
  [[ ",${DEVICE_CHECK_STEPS:-attention,train,sampler}," == *",$1,"* ]]
}

read -r -a attention_args <<<"${ATTENTION_ARGS:-}"
read -r -a train_args <<<"${TRAIN_ARGS:-}"
read -r -a sampler_args <<<"${SAMPLER_ARGS:-}"

# 1. Logits of every attention implementation against the reference path.
if want attention; then
  run_step attention 120 "$PY" benchmarks/device_check.py attention \
    --preset=qwen3-0.6b --layers=4 --batch=2 --seq=1024 "${attention_args[@]}"
fi

# 2. One SFT and one RL step of the 0.6B shape (bf16 compute, model.attention=auto).
if want train; then
  run_step train 200 "$PY" benchmarks/device_check.py train \
    --preset=qwen3-0.6b --batch=8 --seq=2048 --reps=3 --dtype=bfloat16 --attention=auto \
    "${train_args[@]}"
fi

# 3. The sampler bench: transformers on torch CUDA if there is one; a GPU against
# torch on the CPU is no comparison, so without CUDA torch only our side is timed.
if want sampler; then
  torch_cuda="$(timeout 60 "$PY" -c 'import torch, transformers; print(int(torch.cuda.is_available()))' \
    2>/dev/null || echo missing)"
  sampler_cmd=("$PY" benchmarks/sampler_bench.py "--batches=8,32" --prompt_len=64 --new_tokens=128
               --repeats=3 --threads=4)
  case "$torch_cuda" in
    1)
      notes+=("sampler: transformers generate on torch CUDA (fp32; JAX runs fp32 matmuls in TF32)")
      run_step sampler 120 "${sampler_cmd[@]}" --hf_device=cuda "${sampler_args[@]}" ;;
    0)
      notes+=("sampler: torch has no CUDA: our sampler timed alone (no transformers column)")
      run_step sampler 120 "${sampler_cmd[@]}" --hf_device=none "${sampler_args[@]}" ;;
    *)
      notes+=("sampler: not run: it builds its model through torch + transformers, not importable")
      names+=(sampler); states+=("SKIPPED (no torch)"); took+=(0); limits+=(120) ;;
  esac
fi

echo
echo "== device_check summary: $ndev x $kind, jax $jax_version, ${SECONDS}s of ${BUDGET_S}s; logs in $LOGS"
echo "| step | status | seconds | limit s |"
echo "|---|---|---|---|"
failed=0
for i in "${!names[@]}"; do
  echo "| ${names[$i]} | ${states[$i]} | ${took[$i]} | ${limits[$i]} |"
  case "${states[$i]}" in
    ok|SKIPPED*) ;;
    *) failed=1 ;;
  esac
done
echo "figures:"
for name in attention train; do
  if [ -f "$LOGS/$name.log" ]; then
    sed -n 's/^SUMMARY /  /p' "$LOGS/$name.log"
  fi
done
if [ -f "$LOGS/sampler.log" ]; then
  grep -E '^\| (batch|[0-9])' "$LOGS/sampler.log" | sed 's/^/  sampler /' || true
fi
for note in "${notes[@]}"; do
  echo "  note: $note"
done
if [ "$failed" -ne 0 ]; then
  echo "device_check: FAILED (see the table above and $LOGS)"
  exit 1
fi
echo "device_check: all steps passed"
