"""The TPU launch scripts: shellcheck-clean and printing the right gcloud commands."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ["create_tpu.sh", "setup_workers.sh", "train_all.sh", "delete_tpu.sh"]


def _dry_run(script, *args, **env):
  full_env = dict(os.environ, PROJECT="proj", TPU_NAME="t1", ZONE="us-east5-a", **env)
  out = subprocess.run(
      ["bash", os.path.join(ROOT, "launch", script), "--dry_run", *args],
      capture_output=True, text=True, env=full_env, check=True)
  return out.stdout.splitlines()


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean():
  scripts = [os.path.join("launch", f) for f in sorted(os.listdir(os.path.join(ROOT, "launch")))
             if f.endswith(".sh")]
  res = subprocess.run(["shellcheck", "-x", *scripts], cwd=ROOT, capture_output=True, text=True)
  assert res.returncode == 0, res.stdout + res.stderr


def test_create_prints_tpu_vm_create_with_matching_runtime():
  lines = _dry_run("create_tpu.sh", ACCELERATOR="v6e-16")
  assert len(lines) == 1
  line = lines[0]
  assert line.startswith("gcloud compute tpus tpu-vm create t1 ")
  assert "--accelerator-type=v6e-16" in line
  assert "--version=v2-alpha-tpuv6e" in line
  assert "--project=proj" in line and "--zone=us-east5-a" in line
  assert "--spot" not in line


def test_create_queued_spot():
  lines = _dry_run("create_tpu.sh", ACCELERATOR="v5p-64", QUEUED="1", SPOT="1")
  assert lines[0].startswith("gcloud compute tpus queued-resources create t1-qr ")
  assert "--node-id=t1" in lines[0] and "--runtime-version=v2-alpha-tpuv5" in lines[0]
  assert lines[0].rstrip().endswith("--spot")


def test_setup_copies_then_installs_on_all_workers():
  lines = _dry_run("setup_workers.sh")
  assert lines[0].startswith("git -C ") and " archive " in lines[0]
  assert lines[1].startswith("gcloud compute tpus tpu-vm scp ") and "--worker=all" in lines[1]
  assert all("--worker=all" in l for l in lines[1:])
  assert "run_tpu.sh" in lines[-1] and "--install_only" in lines[-1]


def test_setup_clones_when_repo_url_given():
  lines = _dry_run("setup_workers.sh", REPO_URL="https://example.org/r.git")
  assert "git\\ clone" in lines[0] and "--worker=all" in lines[0]


def test_train_all_passes_args_and_collects_logs():
  lines = _dry_run("train_all.sh", "--config=configs/demo.py", "--workdir=gs://b/r")
  ssh = [l for l in lines if " tpu-vm ssh " in l]
  assert len(ssh) == 1 and "--config=configs/demo.py" in ssh[0] and "--worker=all" in ssh[0]
  assert any(" tpu-vm scp " in l and "--worker=all" in l for l in lines)


def test_train_all_without_args_fails():
  res = subprocess.run(["bash", os.path.join(ROOT, "launch", "train_all.sh"), "--dry_run"],
                       capture_output=True, text=True, env=dict(os.environ, PROJECT="p"))
  assert res.returncode == 2 and "usage" in res.stderr


def test_delete():
  assert _dry_run("delete_tpu.sh") == [
      "gcloud compute tpus tpu-vm delete t1 --zone=us-east5-a --project=proj --quiet "]
