"""The command-line layer the entry points share: ``--config``, ``--workdir``, errors.

absl has one flag namespace per process, and the entry points
(``train``, ``evaluate``, ``export_hf``) may be imported together (tests, a
notebook), so the flags they share are defined here, once.

``--config`` is an `ml_collections.config_flags` config file flag, the way
big_vision takes its configs::

  --config=configs/demo.py                      # get_config(None)
  --config=configs/demo.py:runlocal             # get_config("runlocal")
  --config=configs/demo.py:rl.iterations=4      # arg text, then typed overrides
  --config=configs/demo.py --config.rl.iterations=4 --config.rl.grpo.levels=traj

The text after the colon is passed to ``get_config`` and then applied as
``key=value`` overrides by `config_utils.load_config` (typed by the default,
unknown keys named with their closest matches); ``--config.KEY=VALUE`` flags
are applied by config_flags after that. Both forms refuse a key the config
does not have, with the same one-line message. A config that cannot be
loaded is reported by the entry point (`config_value`) as
``<prog>: error: ...`` on one line, exit code 1, like every other bad input.
"""

from __future__ import annotations

import functools
import re
import sys
import textwrap
from typing import Any, NoReturn, Sequence

from absl import app
from absl import flags
import ml_collections
from ml_collections import config_flags
from ml_collections.config_flags import config_flags as config_flags_lib

from paraagent_jax import config_utils
from paraagent_jax import fileio


# Errors met while absl parsed ``--config`` (reported by `config_value` in the
# entry point's one-line format instead of a traceback from inside absl).
_ERRORS: list[config_utils.ConfigError] = []


def _placeholder(config: ml_collections.ConfigDict, key: str) -> None:
  """Adds ``key`` (dotted) as a string leaf if missing, so config_flags can
  apply its override to a config that is only reported, never used."""
  node = config
  parts = key.split(".")
  for part in parts[:-1]:
    if part not in node:
      node[part] = ml_collections.ConfigDict()
    node = node[part]
    if not isinstance(node, ml_collections.ConfigDict):
      return
  if parts[-1] not in node:
    node[parts[-1]] = ""


def _override_keys(argv, name: str) -> list[str]:
  """The KEYs of ``--name.KEY=...`` arguments (as config_flags finds them)."""
  keys = []
  for arg in argv:
    m = re.match(rf"-{{1,2}}(?:no)?{re.escape(name)}\.([^=]+)", arg)
    if m:
      keys.append(m.group(1))
  return keys


def check_keys(config: ml_collections.ConfigDict, keys) -> None:
  """Raises `ConfigError` (naming the closest keys) for a key ``config`` lacks."""
  for key in keys:
    node = config
    for part in key.split("."):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        raise config_utils.unknown_key(key, config)
      node = node[part]


class _ConfigFileParser(config_flags_lib.ConfigFileFlagParser):
  """Loads ``FILE[:arg]`` with `config_utils.load_config` (typed overrides,
  one-line errors) instead of config_flags' own loader."""

  def parse(self, path):
    if not isinstance(path, str):   # absl passes the default through
      return path
    keys = _override_keys(sys.argv, self.name)
    config = ml_collections.ConfigDict()
    try:
      config = config_utils.load_config(path)
      check_keys(config, keys)
    except config_utils.ConfigError as e:
      _ERRORS.append(e)
      for key in keys:
        _placeholder(config, key)
    return config


def _define_config_flag() -> flags.FlagHolder:
  flag = flags.FLAGS["config"] if "config" in flags.FLAGS else None
  if flag is not None:
    return flags.FlagHolder(flags.FLAGS, flag)
  holder = config_flags.DEFINE_config_file(
      "config", None, "Config file and its arguments: configs/X.py[:arg]; then "
      "--config.KEY=VALUE overrides.", lock_config=False)
  flags.FLAGS["config"].parser = _ConfigFileParser("config", lock_config=False)
  return holder


CONFIG = _define_config_flag()
WORKDIR = (flags.FlagHolder(flags.FLAGS, flags.FLAGS["workdir"]) if "workdir" in flags.FLAGS
           else flags.DEFINE_string("workdir", None, "Run directory (checkpoints, "
                                    "metrics); rerun the same command to resume."))
# A checkpoint step of a training workdir (evaluate, export_hf): one flag, so
# that both entry points can be imported in one process.
STEP = (flags.FlagHolder(flags.FLAGS, flags.FLAGS["step"]) if "step" in flags.FLAGS
        else flags.DEFINE_integer("step", None, "Checkpoint step of a training workdir "
                                  "(default: the newest)."))


def config_value(prog: str, default: str | None = None) -> ml_collections.ConfigDict:
  """The parsed ``--config`` (or ``default`` loaded), or a one-line exit."""
  if _ERRORS:
    fail(prog, str(_ERRORS[0]))
  value: Any = CONFIG.value
  if value is None and default:
    try:
      value = config_utils.load_config(default)
    except config_utils.ConfigError as e:
      fail(prog, str(e))
  if value is None:
    fail(prog, "--config is required")
  return value


def check_paths(prog: str, *paths: str | None) -> None:
  """A one-line exit when a remote path's bucket cannot be reached (before
  any work; local paths are not touched)."""
  for p in paths:
    if p:
      try:
        fileio.check_reachable(p)
      except OSError as e:
        fail(prog, str(e))


def fail(prog: str, message: str) -> NoReturn:
  """Exits with ``<prog>: error: <message on one line>`` and status 1."""
  sys.stdout.flush()
  sys.exit(f"{prog}: error: {' '.join(str(message).split())}")


PRINT_CONFIG = (flags.FlagHolder(flags.FLAGS, flags.FLAGS["print_config"])
                if "print_config" in flags.FLAGS
                else flags.DEFINE_bool("print_config", False,
                                       "Print the resolved config (every key, its value, and "
                                       "the file's default where an override changed it) "
                                       "and exit."))

HELP_FLAGS = ("-h", "-help", "--help", "--helpshort")


def _flag_lines(flag) -> list[str]:
  """One flag's help, as absl writes it: name, wrapped help, default."""
  name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
  body = textwrap.wrap(" ".join(str(flag.help).split()), 76)
  default = flag.default_as_str if flag.default is not None else "none"
  return [f"  {name}:"] + [f"    {ln}" for ln in body] + [f"    (default: {default})"]


def help_text(prog: str, doc: str, own: Sequence[str], shared: Sequence[str]) -> str:
  """``--help``: the entry point's docstring, then its flags (its own and the
  shared ones it reads), then how to see the config."""
  lines = [doc.strip(), "", "flags:"]
  for name in list(shared) + list(own):
    lines += _flag_lines(flags.FLAGS[name])
  if "config" in shared:
    lines += [""] + textwrap.wrap(
        f"Every config key and its value: python -m {prog} --config=FILE "
        "--print_config (overrides applied; a key's default is shown where an "
        "override changed it). --helpfull lists absl's own flags too.", 80)
  return "\n".join(lines)


def _parse_flags(prog: str, argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad flag value reported as one line."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(prog, str(e))


def run(main, prog: str, doc: str, own: Sequence[str] = (),
        shared: Sequence[str] = ("config", "workdir")) -> None:
  """`absl.app.run` for an entry point: ``--help`` prints the real flags and
  exits 0; a flag value that does not parse is one ``<prog>: error:`` line."""
  if any(a in HELP_FLAGS for a in sys.argv[1:]):
    print(help_text(prog, doc, own, shared))
    sys.exit(0)
  app.run(main, flags_parser=functools.partial(_parse_flags, prog))


def format_config(config: ml_collections.ConfigDict,
                  default: ml_collections.ConfigDict | None = None) -> str:
  """``key = value`` per leaf, dotted, in order; ``(default: X)`` where the
  value differs from ``default``'s (the config file's before overrides)."""
  out = []

  def walk(node, ref, prefix):
    for key in node.keys():
      val = node[key]
      name = f"{prefix}{key}"
      other = ref[key] if isinstance(ref, ml_collections.ConfigDict) and key in ref else None
      if isinstance(val, ml_collections.ConfigDict):
        walk(val, other, name + ".")
        continue
      line = f"{name} = {val!r}"
      if ref is not None and other != val:
        line += f"    (default: {other!r})"
      out.append(line)

  walk(config, default, "")
  return "\n".join(out)


def print_config_and_exit(config: ml_collections.ConfigDict,
                          default_path: str | None = None) -> NoReturn:
  """``--print_config``: the resolved config against the file's own values."""
  try:   # FILE[:arg] as given, in either flag form
    path = flags.FLAGS["config"].config_filename or default_path
  except config_flags_lib.UnparsedFlagError:   # no --config given
    path = default_path
  default = None
  if path:
    try:
      default = config_utils.load_config(path.split(":", 1)[0])
    except config_utils.ConfigError:
      default = None
  print(format_config(config, default))
  sys.exit(0)
