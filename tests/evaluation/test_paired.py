"""Paired comparison (McNemar's exact test) against scipy and hand-worked counts."""

import json

import pytest
from scipy import stats

from paraagent_jax import checksums
from paraagent_jax.evaluation import paired


@pytest.mark.parametrize("only_a,only_b", [(0, 0), (0, 5), (3, 12), (10, 10), (1, 30), (17, 4)])
def test_mcnemar_exact_matches_scipy_binomtest(only_a, only_b):
  n = only_a + only_b
  want = 1.0 if n == 0 else stats.binomtest(min(only_a, only_b), n, 0.5).pvalue
  assert paired.mcnemar_exact(only_a, only_b) == pytest.approx(want, rel=1e-12)


def test_mcnemar_hand_worked():
  # 0 vs 5 discordant: 2 * 0.5**5 = 1/16.
  assert paired.mcnemar_exact(0, 5) == pytest.approx(1 / 16)
  # 1 vs 3: 2 * (1 + 4) / 16 = 0.625.
  assert paired.mcnemar_exact(1, 3) == pytest.approx(0.625)


def test_paired_comparison_counts_and_cli(tmp_path, capsys):
  a = {"t1": True, "t2": False, "t3": False, "t4": True, "t5": False, "x": True}
  b = {"t1": True, "t2": True, "t3": True, "t4": False, "t5": False, "y": False}
  r = paired.paired_comparison(a, b, ("sft", "rl"))
  assert r == {"tasks": 5, "success_sft": 0.4, "success_rl": 0.6, "only_sft": 1,
               "only_rl": 2, "both": 1, "neither": 1, "mcnemar_p": 1.0}
  line = paired.format_paired(r, ("sft", "rl"))
  assert "2 solved only by rl, 1 only by sft" in line
  with pytest.raises(ValueError, match="share no task"):
    paired.paired_comparison({"a": True}, {"b": True})
  for name, d in (("a.jsonl", a), ("b.jsonl", b)):
    (tmp_path / name).write_text("".join(json.dumps({"task_id": k, "success": v}) + "\n"
                                         for k, v in d.items()))
  assert paired.main(["x", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
  assert "on 5 paired tasks" in capsys.readouterr().out
  assert paired.main(["x", str(tmp_path / "nope.jsonl"), str(tmp_path / "b.jsonl")]) == 1


def test_checksums_detect_a_changed_file(tmp_path):
  (tmp_path / "model.safetensors").write_bytes(b"\x00" * 100)
  (tmp_path / "config.json").write_text("{}")
  assert not checksums.verify_checksums(str(tmp_path))
  with pytest.raises(ValueError, match="no SHA256SUMS"):
    checksums.verify_checksums(str(tmp_path), required=True)
  checksums.write_checksums(str(tmp_path))
  lines = (tmp_path / "SHA256SUMS").read_text().splitlines()
  assert [ln.split()[1] for ln in lines] == ["config.json", "model.safetensors"]
  assert checksums.verify_checksums(str(tmp_path))
  (tmp_path / "model.safetensors").write_bytes(b"\x00" * 99 + b"\x01")
  with pytest.raises(ValueError, match="model.safetensors: checksum mismatch"):
    checksums.verify_checksums(str(tmp_path))
  (tmp_path / "model.safetensors").unlink()
  with pytest.raises(ValueError, match="listed in SHA256SUMS but missing"):
    checksums.verify_checksums(str(tmp_path))
