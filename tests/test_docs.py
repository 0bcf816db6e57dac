"""The documentation matches the code: docs/configuration.md lists exactly the config keys, the README
starts with the main job and the CI suite and stays one page, and it links every page of docs/."""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

from lp.jobs.config import JobConfig

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

MAIN_JOB = "python -m lp.run --config configs/humaneval-smollm2.yaml"
CI_SUITE = 'python -m pytest -q -m "not slow"'
README_MAX_LINES = 210
DOC_LINK = re.compile(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)")


def config_keys() -> set[str]:
    """Every `section.field` of a job config: JobConfig's sections and each section dataclass's fields."""
    cfg = JobConfig()
    return {f"{section.name}.{f.name}" for section in dataclasses.fields(JobConfig)
            for f in dataclasses.fields(getattr(cfg, section.name))}


def documented_keys(text: str) -> list[str]:
    """The backticked names in the first column of the table rows (lines starting with "| `")."""
    keys = []
    for line in text.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            keys += re.findall(r"`([^`]+)`", first)
    return keys


def test_configuration_lists_exactly_the_config_keys():
    listed = documented_keys((DOCS / "configuration.md").read_text())
    want = config_keys()
    assert {k.split(".")[0] for k in want} == {"model", "lookahead", "generation", "data", "output",
                                               "distributed", "baseline"}
    missing, stale = sorted(want - set(listed)), sorted(set(listed) - want)
    assert not missing and not stale, (f"docs/configuration.md tables: missing keys {missing}, "
                                       f"keys the config does not define {stale}")
    twice = sorted(k for k, n in Counter(listed).items() if n > 1)
    assert not twice, f"docs/configuration.md lists these keys more than once: {twice}"


def test_readme_is_one_page_that_starts_with_the_main_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    block = text.split("```bash\n", 1)[1].split("\n```", 1)[0]
    assert MAIN_JOB in block and CI_SUITE in block, block
    assert lines[0].startswith("# ") and lines[2] == "```bash"  # the title, then the two commands


def test_readme_links_every_docs_page():
    linked = set(DOC_LINK.findall(README.read_text()))
    pages = {f"docs/{p.name}" for p in DOCS.glob("*.md")}
    assert pages, "docs/ has no pages"
    assert not sorted(linked - pages), f"README.md links pages that do not exist: {sorted(linked - pages)}"
    assert not sorted(pages - linked), f"README.md does not link: {sorted(pages - linked)}"


def test_links_between_docs_pages_resolve():
    broken = []
    for page in sorted(DOCS.glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s:]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                broken.append(f"{page.name}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"
