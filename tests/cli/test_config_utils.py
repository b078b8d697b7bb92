"""Tests of the config loader: typed overrides, nested keys, clear errors."""

import os
import textwrap

import ml_collections
import pytest

from paraagent_jax import config_utils as cu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "configs", "demo.py")
TINY = os.path.join(ROOT, "configs", "sft_tiny.py")


@pytest.fixture
def toy_config(tmp_path):
  path = tmp_path / "toy.py"
  path.write_text(textwrap.dedent("""
      import ml_collections
      from paraagent_jax import config_utils

      def get_config(arg=None):
        a = config_utils.parse_arg(arg, runlocal=False, size="big")
        c = ml_collections.ConfigDict()
        c.runlocal = a.runlocal
        c.size = a.size
        c.steps = 10 if a.runlocal else 1000
        c.lr = 0.1
        c.name = "x"
        c.flag = False
        c.maybe = None
        c.shape = (1, 2)
        c.opt = ml_collections.ConfigDict(dict(b1=0.9, sched="cos",
                                               inner=dict(k=3)))
        return c
      """))
  return str(path)


def test_split_pairs_respects_brackets_and_quotes():
  pairs = cu.split_pairs("a=1,b=(1,2),c='x,y',runlocal, d.e=[3, 4] ")
  assert pairs == [("a", "1"), ("b", "(1,2)"), ("c", "'x,y'"),
                   ("runlocal", "True"), ("d.e", "[3, 4]")]
  assert cu.split_pairs("") == [] and cu.split_pairs(None) == []
  with pytest.raises(cu.ConfigError, match="unbalanced"):
    cu.split_pairs("a=(1,2")


@pytest.mark.parametrize("raw,default,expected", [
    ("true", False, True), ("0", True, False), ("7", 1, 7),
    ("3", 0.5, 3.0), ("1e-3", 0.1, 1e-3), ("abc", "s", "abc"),
    ("'a,b'", "s", "a,b"), ("(2,2,2)", (1,), (2, 2, 2)), ("5", (1,), (5,)),
    ("[1, 2]", [0], [1, 2]), ("12", None, 12), ("None", None, None),
])
def test_parse_value_takes_the_type_of_the_default(raw, default, expected):
  value = cu.parse_value("k", raw, default)
  assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("raw,default,what", [
    ("maybe", True, "bool"), ("1.5", 3, "int"), ("fast", 0.1, "float")])
def test_parse_value_rejects_wrong_types(raw, default, what):
  with pytest.raises(cu.ConfigError, match=f"expected an? {what}"):
    cu.parse_value("k", raw, default)


def test_arguments_shape_the_config_and_overrides_apply(toy_config):
  c = cu.load_config(toy_config + ":runlocal,lr=0.5,opt.inner.k=9,"
                     "shape=(4,4),name=hello,maybe=3")
  assert c.runlocal is True and c.steps == 10  # The file's runlocal branch.
  assert c.lr == 0.5 and c.opt.inner.k == 9 and c.shape == (4, 4)
  assert c.name == "hello" and c.maybe == 3
  assert cu.load_config(toy_config).steps == 1000
  # An override wins over the file's own value of the same key.
  assert cu.load_config(toy_config + ":runlocal,steps=3").steps == 3


def test_unknown_key_names_close_matches(toy_config):
  with pytest.raises(cu.ConfigError) as e:
    cu.load_config(toy_config + ":opt.b2=0.99")
  msg = str(e.value)
  assert "unknown config key 'opt.b2'" in msg and "opt.b1" in msg
  assert "\n" not in msg
  with pytest.raises(cu.ConfigError, match="did you mean runlocal"):
    cu.load_config(toy_config + ":runlocl=True")
  # A misspelt parent is reported with the full key.
  with pytest.raises(cu.ConfigError, match="'op.b1'.*opt.b1"):
    cu.load_config(toy_config + ":op.b1=1")


def test_group_and_bad_value_errors(toy_config):
  with pytest.raises(cu.ConfigError, match="opt is a group.*opt.b1"):
    cu.load_config(toy_config + ":opt=3")
  with pytest.raises(cu.ConfigError, match=r"steps='x': expected an int"):
    cu.load_config(toy_config + ":steps=x")
  with pytest.raises(cu.ConfigError, match="expected key=value"):
    cu.load_config(toy_config + ":=3")


def test_missing_and_bad_config_files(tmp_path):
  with pytest.raises(cu.ConfigError, match="not found; available in .*demo.py"):
    cu.load_config(os.path.join(ROOT, "configs", "nope.py"))
  with pytest.raises(cu.ConfigError, match="not a .py file"):
    cu.load_config("configs/demo")
  empty = tmp_path / "empty.py"
  empty.write_text("x = 1\n")
  with pytest.raises(cu.ConfigError, match="no get_config"):
    cu.load_config(str(empty))


def test_project_configs_have_a_local_variant():
  demo = cu.load_config(DEMO)
  local = cu.load_config(DEMO + ":runlocal,stage=sft")
  assert demo.stage == "pipeline" and local.stage == "sft"
  assert local.total_steps < demo.total_steps
  assert local.model.preset == "tiny" and demo.model.preset == "demo"
  assert cu.load_config(DEMO + ":size=tiny").model.preset == "tiny"
  tiny = cu.load_config(TINY + ":runlocal")
  assert tiny.total_steps < cu.load_config(TINY).total_steps
  assert tiny.data.source == "synthetic"


def test_demo_variants_start_from_the_right_policy():
  shipped = os.path.join(ROOT, "pretrained", "demo_sft")
  demo = cu.load_config(DEMO)
  assert tuple(demo.pipeline.stages) == ("demos", "rl")
  assert demo.init_from == shipped and demo.data.tokenizer == shipped
  assert cu.load_config(DEMO + ":stage=rl").init_from == shipped
  # The smoke run starts RL from the shipped policy too (its groups have
  # spread, so RL updates); from_scratch runs the tiny SFT first.
  local = cu.load_config(DEMO + ":runlocal")
  assert local.init_from == shipped and tuple(local.pipeline.stages) == ("demos", "rl")
  for arg in (":from_scratch=True", ":stage=sft,budget=long", ":runlocal,from_scratch=True"):
    c = cu.load_config(DEMO + arg)
    assert c.init_from == "" and c.data.tokenizer == "", arg
    # From scratch, the pipeline runs both SFT phases of the shipped recipe.
    want = ("demos", "sft", "rl") if "stage=sft" in arg else ("demos", "sft", "sft2", "rl")
    assert tuple(c.pipeline.stages) == want, arg
  scratch = cu.load_config(DEMO + ":from_scratch=True")
  phase2 = cu.load_config(DEMO + ":stage=sft,budget=long2,init_from=/x")
  assert scratch.pipeline.sft2.total_steps == phase2.total_steps
  assert tuple(scratch.pipeline.sft2.data.kinds) == tuple(phase2.data.kinds)
  assert phase2.data.tokenizer == "/x/demos/tokenizer" and phase2.data.copy_warmup == 0
  with pytest.raises(cu.ConfigError, match="init_from"):
    cu.load_config(DEMO + ":stage=sft,budget=long2")
  long, short = (cu.load_config(DEMO + f":stage=sft,budget={b}") for b in ("long", "short"))
  warm = long.data.copy_warmup + long.data.turn_warmup
  assert short.total_steps - warm < long.total_steps - warm
  assert long.data.num_tasks == 8000 and demo.data.num_tasks == 1600
  with pytest.raises(cu.ConfigError, match="budget"):
    cu.load_config(DEMO + ":budget=medium")


def test_train_defaults_are_plain_serialisable():
  c = cu.train_defaults()
  d = cu.to_dict(c)
  assert d["optimizer"]["learning_rate"] == c.optimizer.learning_rate
  assert d["pipeline"]["stages"] == ["demos", "sft", "rl"]
  assert isinstance(ml_collections.ConfigDict(d), ml_collections.ConfigDict)
  keys = set(cu.iter_keys(c))
  assert {"mesh.fsdp", "data.source", "optimizer.total_steps"} <= keys


def test_demonstration_defaults_are_one_table():
  """Unset and None keys take the one default; set keys win; unknown keys stay."""
  d = cu.with_defaults({"overlong": "truncate", "length_bucket": "512,1024",
                                  "kinds": None, "extra": 3},
                                 cu.demonstration_defaults())
  assert d.overlong == "truncate" and d.length_bucket == "512,1024"
  assert d.kinds == () and d.copy_len == 256 and d.extra == 3
  assert cu.with_defaults(None, cu.demonstration_defaults()).overlong == "drop"


def test_rl_catalog_follows_the_demonstrations():
  from paraagent_jax.trainer import specs  # pylint: disable=g-import-not-at-top
  c = cu.train_defaults()
  assert specs.rl_catalog(c) == "procedural"
  c.data.catalog = "openapi"
  assert specs.rl_catalog(c) == "openapi"
  c.rl.catalog = "procedural"
  assert specs.rl_catalog(c) == "procedural"
