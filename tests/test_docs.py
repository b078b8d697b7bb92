"""The README and docs/: every relative link resolves, guides and records apart."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pages():
  return ([os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md"))
          + glob.glob(os.path.join(ROOT, "docs", "records", "*.md"))
          + glob.glob(os.path.join(ROOT, "pretrained", "*", "README.md")))


def test_every_relative_link_resolves():
  broken = []
  for page in _pages():
    with open(page, encoding="utf-8") as f:
      text = f.read()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      path = target.split("#")[0]
      if not path or target.startswith(("http://", "https://", "mailto:")):
        continue
      if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(page), path))):
        broken.append((os.path.relpath(page, ROOT), target))
  assert not broken, broken


def test_no_page_counts_work_sessions_and_the_readme_stays_short():
  for page in _pages():
    with open(page, encoding="utf-8") as f:
      text = f.read()
    hits = re.findall(r"\b(?:first|second|third|\w+th) session\b|\bthis session\b", text)
    assert not hits, (os.path.relpath(page, ROOT), hits)
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    assert len(f.read().splitlines()) <= 300


def test_every_record_opens_with_its_current_result():
  for page in glob.glob(os.path.join(ROOT, "docs", "records", "*.md")):
    with open(page, encoding="utf-8") as f:
      head = f.read().split("\n## ")[0]
    assert "\n| " in head, os.path.relpath(page, ROOT)
