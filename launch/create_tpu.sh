#!/usr/bin/env bash
# Creates a TPU VM (directly, or through a queued resource with QUEUED=1).
#
#   ACCELERATOR=v5p-64 ZONE=us-east5-a launch/create_tpu.sh [--dry_run]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/common.sh
source "$HERE/common.sh"

usage() {
  echo "usage: [TPU_NAME=.. ZONE=.. ACCELERATOR=.. QUEUED=0|1 SPOT=0|1] $0 [--dry_run]"
}
parse_common_flags "$@"
version="${RUNTIME_VERSION:-$(default_runtime_version)}"
spot_flag=()
if [ "$SPOT" -eq 1 ]; then spot_flag=(--spot); fi

if [ "$QUEUED" -eq 1 ]; then
  run gcloud compute tpus queued-resources create "${TPU_NAME}-qr" \
    --node-id="$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
    --accelerator-type="$ACCELERATOR" --runtime-version="$version" \
    "${spot_flag[@]}"
  run gcloud compute tpus queued-resources describe "${TPU_NAME}-qr" \
    --zone="$ZONE" --project="$PROJECT"
else
  run gcloud compute tpus tpu-vm create "$TPU_NAME" \
    --zone="$ZONE" --project="$PROJECT" \
    --accelerator-type="$ACCELERATOR" --version="$version" \
    "${spot_flag[@]}"
fi
