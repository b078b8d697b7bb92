#!/usr/bin/env bash
# Runs ON a TPU worker: makes a venv, installs jax[tpu] and the project, and
# starts training. Every worker runs the same command; JAX finds its peers.
#
#   bash launch/run_tpu.sh --config=configs/paraagent_4b.py --workdir=gs://bucket/run1
#   bash launch/run_tpu.sh --install_only
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-$HOME/paraagent-venv}"
install_only=0
args=()
for arg in "$@"; do
  case "$arg" in
    --install_only) install_only=1 ;;
    --dry_run|--dry-run) echo "run_tpu.sh runs on a TPU worker; nothing to print."; exit 0 ;;
    *) args+=("$arg") ;;
  esac
done

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
pip install -q --upgrade pip
pip install -q -r requirements.txt
pip install -q -U "jax[tpu]"
if [ "$install_only" -eq 1 ]; then
  python -c "import jax; print(jax.process_index(), jax.device_count())"
  exit 0
fi
# Several hosts: paraagent_jax.train calls jax.distributed.initialize() itself
# when it sees a multi-host TPU (config.distributed="auto").
exec python -m paraagent_jax.train "${args[@]}"
