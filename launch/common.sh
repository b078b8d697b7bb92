#!/usr/bin/env bash
# Shared settings and helpers for the TPU VM launch scripts. Sourced, not run.
#
# Every setting can be overridden from the environment, e.g.
#   TPU_NAME=my-tpu ZONE=us-east5-a ACCELERATOR=v5p-64 launch/create_tpu.sh --dry_run

: "${PROJECT:=$(gcloud config get-value project 2>/dev/null || echo my-project)}"
: "${TPU_NAME:=paraagent-tpu}"
: "${ZONE:=us-east5-a}"
: "${ACCELERATOR:=v5p-64}"
: "${RUNTIME_VERSION:=}"
: "${REPO_URL:=}"                   # clone this on the workers; empty: copy the local tree
: "${REMOTE_DIR:=paraagent-jax}"    # on every worker, relative to the home directory
: "${LOG_DIR:=logs}"                # local folder for the collected worker logs
: "${QUEUED:=0}"                    # 1: create through a queued resource
: "${SPOT:=0}"                      # 1: spot capacity

DRY_RUN=0
EXTRA_ARGS=()

# Parses the flags common to all scripts; the rest are kept in EXTRA_ARGS.
parse_common_flags() {
  EXTRA_ARGS=()
  for arg in "$@"; do
    case "$arg" in
      --dry_run|--dry-run) DRY_RUN=1 ;;
      --help|-h) usage; exit 0 ;;
      *) EXTRA_ARGS+=("$arg") ;;
    esac
  done
}

# Picks the TPU VM software version that matches the accelerator generation.
default_runtime_version() {
  case "$ACCELERATOR" in
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v5litepod-*) echo "v2-alpha-tpuv5-lite" ;;
    v4-*) echo "tpu-ubuntu2204-base" ;;
    *) echo "tpu-ubuntu2204-base" ;;
  esac
}

# Runs a command, or prints it (shell-quoted, one per line) under --dry_run.
run() {
  if [ "$DRY_RUN" -eq 1 ]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

# Runs a shell snippet on every worker of the TPU VM.
on_all_workers() {
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
    --worker=all --command="$1"
}
