#!/usr/bin/env bash
# Puts the code on every worker (git clone of REPO_URL, or a copy of this tree)
# and installs it with jax[tpu] in a virtual environment there.
#
#   launch/setup_workers.sh [--dry_run]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/common.sh
source "$HERE/common.sh"

usage() { echo "usage: [TPU_NAME=.. ZONE=.. REPO_URL=..] $0 [--dry_run]"; }
parse_common_flags "$@"
ROOT="$(cd "$HERE/.." && pwd)"

if [ -n "$REPO_URL" ]; then
  on_all_workers "rm -rf ~/$REMOTE_DIR && git clone --depth 1 $REPO_URL ~/$REMOTE_DIR"
else
  archive="$(mktemp -d)/paraagent-jax.tar.gz"
  run git -C "$ROOT" archive --format=tar.gz -o "$archive" HEAD
  run gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME:~/paraagent-jax.tar.gz" \
    --zone="$ZONE" --project="$PROJECT" --worker=all
  on_all_workers "rm -rf ~/$REMOTE_DIR && mkdir -p ~/$REMOTE_DIR && tar -xzf ~/paraagent-jax.tar.gz -C ~/$REMOTE_DIR"
fi
on_all_workers "cd ~/$REMOTE_DIR && bash launch/run_tpu.sh --install_only"
