"""Wheels of the project's dependencies that an offline machine lacks.

A GPU node often has a Python with JAX (CUDA), torch and transformers, but no
internet and not all of `requirements.txt` (e.g. `ml-collections`,
`tensorflow-datasets`). This script, run on a machine that has the project's
environment and can reach a package index, works out which distributions the
target lacks and downloads wheels of them, for the target's Python and
platform, into one folder to copy over.

Which ones: the dependency closure of the requirement files, walked through
the metadata of the distributions installed *here* (the versions here are the
ones fetched), with environment markers evaluated for the target's Python.
A distribution the target already has is not fetched, and its own dependencies
are not walked (the target's version of it brings what it needs).

  # the target's installed names: `python3 -m pip list --format=freeze` there
  python scripts/offline_wheels.py --have=target_pip_list.txt --python-version=3.12 \
      --out=.whl
  # then on the target, from the repository root:
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site

`--dry_run` prints the list and the pip commands without fetching. A target
version outside a requirement's specifier (from `name==version` lines) is
warned of, not replaced. A wheel pip cannot download (a project that publishes
only a source archive) is built here with `pip wheel`; that works for
pure-Python projects only, and the script says which ones it built.
"""

import argparse
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tempfile

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

# Platform tags pip matches exactly, newest first: any glibc Linux x86-64 that
# the target may report.
_LINUX_X86 = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
              "manylinux_2_17_x86_64", "manylinux2014_x86_64",
              "manylinux1_x86_64")


def normalize(name: str) -> str:
  """A distribution name in its canonical form (PEP 503)."""
  return re.sub(r"[-_.]+", "-", name).lower()


def read_names(path: str) -> dict:
  """{name: version or None} from a `pip list`/`pip freeze` output or names.

  Accepts `name==version`, `name version` (pip list's columns) or bare names,
  commas or newlines between them; header, comment and blank lines are
  skipped. A version is kept only where the line gives a plain one.
  """
  names = {}
  with open(path) as f:
    for line in f:
      for item in line.split(","):
        item = item.strip()
        if not item or item.startswith(("#", "Package", "---")):
          continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:==|\s+)([0-9][^\s]*)",
                         item)
        if m:
          names[normalize(m.group(1))] = m.group(2)
        else:
          name = re.split(r"[\s=<>!~@;\[]", item, maxsplit=1)[0]
          names.setdefault(normalize(name), None)
  return names


def unmet(reqs, have: dict) -> list:
  """The requirements the target has at a version outside their specifier."""
  out = []
  for req in reqs:
    version = have.get(normalize(req.name))
    if version is None or not req.specifier:
      continue
    try:
      ok = req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
      continue
    if not ok:
      out.append(f"the target's {req.name} {version} does not satisfy {req}")
  return out


def top_requirements(paths) -> list:
  """The requirements of pip requirement files (comments and options skipped)."""
  reqs = []
  for path in paths:
    with open(path) as f:
      for line in f:
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
          reqs.append(Requirement(line))
  return reqs


def missing_closure(reqs, have: set, python_version: str,
                    distribution=md.distribution) -> dict:
  """{name: version} of the dependency closure of `reqs` that `have` lacks.

  The closure is walked through installed metadata (`distribution(name)`,
  importlib.metadata's by default); a requirement whose marker is false for
  `python_version` is left out, and a distribution in `have` is neither
  fetched nor walked into.

  Raises:
    LookupError: a needed distribution is not installed here (so neither its
      version nor its dependencies are known).
  """
  env = {"python_version": python_version,
         "python_full_version": python_version + ".0"}
  missing, seen = {}, set()
  stack = [(r, frozenset()) for r in reqs]
  while stack:
    req, parent_extras = stack.pop()
    if req.marker is not None:
      extras = parent_extras or {""}
      if not any(req.marker.evaluate(dict(env, extra=e)) for e in extras):
        continue
    name = normalize(req.name)
    key = (name, frozenset(req.extras))
    if name in have or key in seen:
      continue
    seen.add(key)
    try:
      dist = distribution(req.name)
    except md.PackageNotFoundError:
      raise LookupError(
          f"{req.name} is needed but not installed here: install the "
          "requirements in this environment first") from None
    missing[name] = dist.version
    for r in dist.requires or []:
      stack.append((Requirement(r), frozenset(req.extras)))
  return missing


def download_command(name: str, version: str, out: str, python_version: str,
                     platforms=_LINUX_X86) -> list:
  """`pip download` of one wheel for the target (no dependencies)."""
  cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
         "--only-binary=:all:", "--python-version", python_version,
         "--implementation", "cp", "-d", out]
  for p in platforms:
    cmd += ["--platform", p]
  return cmd + [f"{name}=={version}"]


def build_command(name: str, version: str, out: str) -> list:
  """`pip wheel` of one source-only project (pure Python), no dependencies."""
  return [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out,
          f"{name}=={version}"]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--have", required=True,
                  help="file naming what the target has installed "
                       "(its `pip list --format=freeze`, or names)")
  ap.add_argument("--python-version", default="3.12",
                  help="the target's Python, major.minor")
  ap.add_argument("-r", "--requirements", action="append",
                  help="requirement file (repeatable; default requirements.txt)")
  ap.add_argument("--skip", default="",
                  help="comma-separated names never to fetch")
  ap.add_argument("--out", default=".whl", help="folder for the wheels")
  ap.add_argument("--dry_run", action="store_true",
                  help="print the list and the commands, fetch nothing")
  args = ap.parse_args(argv)
  if not re.fullmatch(r"3\.\d+", args.python_version):
    ap.error(f"--python-version={args.python_version}: expected major.minor, "
             "e.g. 3.12")
  if not os.path.isfile(args.have):
    ap.error(f"--have={args.have}: no such file")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  req_files = args.requirements or [os.path.join(root, "requirements.txt")]
  have_versions = read_names(args.have)
  if not have_versions:
    ap.error(f"--have={args.have}: no distribution names in it")
  have = set(have_versions) | {normalize(s) for s in args.skip.split(",") if s}
  reqs = top_requirements(req_files)
  for line in unmet(reqs, have_versions):
    print(f"offline_wheels: warning: {line}; it is not replaced (install "
          "that version there, or leave it out of --have)", file=sys.stderr)
  try:
    missing = missing_closure(reqs, have, args.python_version)
  except LookupError as e:
    print(f"offline_wheels: error: {e}", file=sys.stderr)
    return 1
  print(f"{len(missing)} distributions the target lacks "
        f"(Python {args.python_version}):")
  for name, version in sorted(missing.items()):
    print(f"  {name}=={version}")
  if not args.dry_run:
    os.makedirs(args.out, exist_ok=True)
  built = []
  for name, version in sorted(missing.items()):
    cmd = download_command(name, version, args.out, args.python_version)
    if args.dry_run:
      print(" ".join(cmd))
      continue
    if subprocess.run(cmd, capture_output=True, text=True).returncode == 0:
      continue
    with tempfile.TemporaryDirectory() as tmp:
      res = subprocess.run(build_command(name, version, tmp),
                           capture_output=True, text=True)
      wheels = os.listdir(tmp) if res.returncode == 0 else []
      if res.returncode != 0 or not all(w.endswith("-none-any.whl")
                                        for w in wheels):
        why = (res.stderr[-2000:] if res.returncode != 0 else
               f"the build is not pure Python: {wheels}")
        print(f"offline_wheels: error: no wheel of {name}=={version} for "
              f"Python {args.python_version} on the index, and none could be "
              f"built here for any Python: {why}", file=sys.stderr)
        return 1
      for w in wheels:
        shutil.move(os.path.join(tmp, w), os.path.join(args.out, w))
    built.append(f"{name}=={version}")
  if built:
    print("built here from source (pure Python): " + ", ".join(built))
  print("on the target, from the repository root:\n"
        f"  python3 -m pip install -q --no-index --no-deps --target /tmp/site "
        f"{args.out}/*.whl && export PYTHONPATH=/tmp/site")
  return 0


if __name__ == "__main__":
  sys.exit(main())
