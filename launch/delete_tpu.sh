#!/usr/bin/env bash
# Deletes the TPU VM (and its queued resource, with QUEUED=1).
#
#   launch/delete_tpu.sh [--dry_run]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/common.sh
source "$HERE/common.sh"

usage() { echo "usage: [TPU_NAME=.. ZONE=.. QUEUED=0|1] $0 [--dry_run]"; }
parse_common_flags "$@"
if [ "$QUEUED" -eq 1 ]; then
  run gcloud compute tpus queued-resources delete "${TPU_NAME}-qr" \
    --zone="$ZONE" --project="$PROJECT" --force --quiet
else
  run gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" --quiet
fi
