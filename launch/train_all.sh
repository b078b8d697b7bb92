#!/usr/bin/env bash
# Starts training on all workers at once and collects their logs locally.
#
#   launch/train_all.sh --config=configs/paraagent_4b.py --workdir=gs://bucket/run1 [--dry_run]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/common.sh
source "$HERE/common.sh"

usage() { echo "usage: [TPU_NAME=.. ZONE=..] $0 --config=... --workdir=... [--dry_run]"; }
parse_common_flags "$@"
if [ "${#EXTRA_ARGS[@]}" -eq 0 ]; then
  usage >&2
  exit 2
fi
train_args="$(printf '%q ' "${EXTRA_ARGS[@]}")"
stamp="$(date +%Y%m%d-%H%M%S)"
# Each worker writes its own log; they are fetched at the end, even on failure.
on_all_workers "cd ~/$REMOTE_DIR && bash launch/run_tpu.sh $train_args > ~/train-$stamp.log 2>&1; echo exit=\$? >> ~/train-$stamp.log" || true
run mkdir -p "$LOG_DIR/$stamp"
run gcloud compute tpus tpu-vm scp "$TPU_NAME:~/train-$stamp.log" "$LOG_DIR/$stamp/" \
  --zone="$ZONE" --project="$PROJECT" --worker=all
echo "logs in $LOG_DIR/$stamp"
