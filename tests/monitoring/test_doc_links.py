"""The documents hold together: every relative link in the README, the CHANGELOG, docs/ and
tests/bench/README.md names a file or folder that exists, and every #anchor names a heading
of its target (GitHub's slugs); the README leads with the test command that .ci/run runs.
No database needed."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "tests" / "bench" / "README.md"]
              + list((ROOT / "docs").rglob("*.md")))

LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    s = heading.strip().lower()
    s = re.sub(r"[`*_]", "", s)
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path: pathlib.Path) -> set:
    seen, out = {}, set()
    for line in prose(path.read_text(encoding="utf-8")).split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def links(path: pathlib.Path):
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        yield target


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    bad = []
    for target in links(doc):
        file_part, _, frag = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
            continue
        if frag and dest.is_file() and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{target}: no heading #{frag} in {dest.relative_to(ROOT)}")
    assert not bad, f"{doc.relative_to(ROOT)}:\n  " + "\n  ".join(bad)


def test_the_readme_leads_with_the_two_commands_and_ci_runs_its_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = readme.split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in first_block.strip().split("\n")]
    assert commands[:2] == ["examples/demo", "tests/run"], commands
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^exec tests/run\s*$", ci, re.M), ".ci/run no longer runs the README's test command"


def test_every_decision_record_is_listed_and_has_its_parts():
    folder = ROOT / "docs" / "decisions"
    index = (folder / "README.md").read_text(encoding="utf-8")
    for rec in sorted(folder.glob("[0-9][0-9][0-9][0-9]-*.md")):
        assert f"]({rec.name})" in index, f"{rec.name} is not listed in docs/decisions/README.md"
        text = rec.read_text(encoding="utf-8")
        for part in ("**Date:**", "## Context", "## Decision", "## Numbers", "## Consequences"):
            assert part in text, f"{rec.name} has no {part}"
