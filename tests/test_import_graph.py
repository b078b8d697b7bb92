"""No import circle in the packages, counting what `lint-imports` cannot see.

import-linter's layer contracts (pyproject.toml, run by .ci/run) follow static
imports. A circle can also close through an import inside a function or an
``importlib.import_module("literal")`` plug-in lookup, which is how
``toolenv.catalog.registry`` <-> ``toolenv.catalog.procedural`` was one. This
test builds the module graph from the source (every ``import``, wherever it is,
and every ``import_module`` of a string constant) and requires it to be acyclic.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("paraagent_jax", "toolenv")


def _modules(root=ROOT):
  mods = {}
  for pkg in PACKAGES:
    for dirpath, _, files in os.walk(os.path.join(root, pkg)):
      for f in files:
        if f.endswith(".py"):
          path = os.path.join(dirpath, f)
          name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
          mods[name.removesuffix(".__init__")] = path
  return mods


def import_graph(mods):
  """module -> the package modules it imports (parents of itself left out)."""
  def resolve(name):
    while name and name not in mods:
      name = name.rpartition(".")[0]
    return name
  edges = {m: set() for m in mods}
  for m, path in mods.items():
    pkg = m if path.endswith("__init__.py") else m.rpartition(".")[0]
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      targets = []
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          b = pkg
          for _ in range(node.level - 1):
            b = b.rpartition(".")[0]
          base = b + ("." + base if base else "")
        targets = [base] + [f"{base}.{a.name}" for a in node.names]
      elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant)):
        targets = [node.args[0].value]
      for t in targets:
        r = resolve(t)
        if r and r != m and not m.startswith(r + "."):
          edges[m].add(r)
  return edges


def cycles(edges):
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(edges[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return out


def test_the_checker_finds_a_lazy_and_a_plugin_circle(tmp_path):
  pkg = tmp_path / "toolenv"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("import importlib\ndef f():\n  importlib.import_module('toolenv.b')\n")
  (pkg / "b.py").write_text("from toolenv.a import f\n")
  (pkg / "c.py").write_text("def g():\n  from . import d\n")
  (pkg / "d.py").write_text("from toolenv import c\n")
  (pkg / "e.py").write_text("from toolenv import a\n")
  found = cycles(import_graph(_modules(str(tmp_path))))
  assert sorted(found) == [["toolenv.a", "toolenv.b"], ["toolenv.c", "toolenv.d"]]


def test_no_import_circle_in_the_packages():
  edges = import_graph(_modules())
  # The default catalog is a plug-in: it imports nothing of the registry.
  assert "toolenv.catalog.registry" not in edges["toolenv.catalog.procedural"]
  assert cycles(edges) == []
