"""scripts/offline_wheels.py: which distributions an offline target lacks.

The closure walk is checked on a hand-made dependency graph (markers, extras,
a distribution the target has, a missing one); the CLI in --dry_run mode on
this environment's real metadata (nothing is downloaded).
"""

import importlib.metadata as md
import os
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import offline_wheels as ow  # noqa: E402


class _Dist:
  def __init__(self, version, requires):
    self.version, self.requires = version, requires


# app -> lib_b, lib_c[fast]; lib_c -> lib_d, and lib_e only with its "fast"
# extra; app -> old_backport only before Python 3.12; lib_b (the target has it)
# -> lib_g, which must not be walked into.
_GRAPH = {
    "app": _Dist("1.0", ["lib-b>=1", "lib_c[fast]",
                         'old-backport; python_version < "3.12"']),
    "lib-b": _Dist("2.0", ["lib-g"]),
    "lib_c": _Dist("3.1", ["lib-d", 'lib-e; extra == "fast"',
                           'lib-f; extra == "slow"']),
    "lib-d": _Dist("0.4", None),
    "lib-e": _Dist("5.0", []),
    "lib-f": _Dist("6.0", []),
    "lib-g": _Dist("7.0", []),
    "old-backport": _Dist("0.1", []),
}


def _fake_distribution(name):
  try:
    return _GRAPH[name]
  except KeyError:
    raise md.PackageNotFoundError(name) from None


def test_closure_skips_what_the_target_has_and_false_markers():
  got = ow.missing_closure([Requirement("app")], {"lib-b"}, "3.12",
                           distribution=_fake_distribution)
  # lib-b: the target has it (and its lib-g is the target's business);
  # old-backport: marker false on 3.12; lib-f: an extra nobody asked for.
  assert got == {"app": "1.0", "lib-c": "3.1", "lib-d": "0.4", "lib-e": "5.0"}


def test_closure_evaluates_markers_for_the_target_python():
  got = ow.missing_closure([Requirement("app")], {"lib-b"}, "3.11",
                           distribution=_fake_distribution)
  assert got["old-backport"] == "0.1"


def test_closure_names_a_dependency_that_is_not_installed_here():
  graph = dict(_GRAPH, **{"lib-d": _Dist("0.4", ["nowhere-pkg"])})

  def distribution(name):
    if name not in graph:
      raise md.PackageNotFoundError(name)
    return graph[name]

  with pytest.raises(LookupError, match="nowhere-pkg is needed but not installed"):
    ow.missing_closure([Requirement("app")], set(), "3.12",
                       distribution=distribution)


def test_read_names_takes_freeze_list_and_comma_forms(tmp_path):
  p = tmp_path / "have.txt"
  p.write_text("Package    Version\n---------- -------\nJax        0.11.2\n"
               "flax==0.12.1\nml_collections @ file:///x\n\n"
               "absl-py, Orbax.Checkpoint,torch\n# a comment\n")
  assert ow.read_names(str(p)) == {
      "jax": "0.11.2", "flax": "0.12.1", "ml-collections": None,
      "absl-py": None, "orbax-checkpoint": None, "torch": None}


def test_unmet_names_versions_outside_the_specifier():
  reqs = [Requirement("flax>=0.12.0"), Requirement("jax>=0.10.0"),
          Requirement("numpy"), Requirement("optax>=0.2.5")]
  have = {"flax": "0.10.4", "jax": "0.11.2", "numpy": "1.0", "optax": None}
  assert ow.unmet(reqs, have) == [
      "the target's flax 0.10.4 does not satisfy flax>=0.12.0"]


def test_download_command_pins_version_and_target():
  cmd = ow.download_command("dm-tree", "0.1.10", "/o", "3.12")
  assert cmd[-1] == "dm-tree==0.1.10"
  i = cmd.index("--python-version")
  assert cmd[i + 1] == "3.12" and "--no-deps" in cmd
  assert "--only-binary=:all:" in cmd and "manylinux2014_x86_64" in cmd


def _cli(*args):
  return subprocess.run([sys.executable, "scripts/offline_wheels.py", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_dry_run_on_this_environment(tmp_path):
  # A target that has everything of requirements.txt but ml-collections:
  # only ml-collections (and what it needs that the target lacks) is fetched.
  reqs = ow.top_requirements([os.path.join(ROOT, "requirements.txt")])
  have = tmp_path / "have.txt"
  have.write_text("\n".join(r.name for r in reqs
                            if ow.normalize(r.name) != "ml-collections"))
  res = _cli(f"--have={have}", "--dry_run", "--out", str(tmp_path / "w"))
  assert res.returncode == 0, res.stderr
  listed = [line.strip() for line in res.stdout.splitlines()
            if line.startswith("  ") and "==" in line and "pip" not in line]
  expected = ow.missing_closure(
      [Requirement("ml-collections")],
      {ow.normalize(r.name) for r in reqs} - {"ml-collections"}, "3.12")
  assert listed == [f"{n}=={v}" for n, v in sorted(expected.items())]
  assert f"ml-collections=={md.version('ml-collections')}" in listed
  assert not (tmp_path / "w").exists()          # a dry run fetches nothing


def test_cli_rejects_bad_arguments(tmp_path):
  res = _cli("--have=/nonexistent/list.txt")
  assert res.returncode == 2 and "no such file" in res.stderr
  have = tmp_path / "have.txt"
  have.write_text("jax\n")
  res = _cli(f"--have={have}", "--python-version=312", "--dry_run")
  assert res.returncode == 2 and "expected major.minor" in res.stderr
  empty = tmp_path / "empty.txt"
  empty.write_text("# nothing\n")
  res = _cli(f"--have={empty}", "--dry_run")
  assert res.returncode == 2 and "no distribution names" in res.stderr


def test_cli_warns_of_a_target_version_below_the_requirement(tmp_path):
  reqs = ow.top_requirements([os.path.join(ROOT, "requirements.txt")])
  have = tmp_path / "have.txt"
  have.write_text("\n".join(f"{r.name}==0.0.1" if ow.normalize(r.name) == "flax"
                            else r.name for r in reqs))
  res = _cli(f"--have={have}", "--dry_run")
  assert res.returncode == 0, res.stderr
  assert "warning: the target's flax 0.0.1 does not satisfy flax>=" in res.stderr
  assert "0 distributions the target lacks" in res.stdout
