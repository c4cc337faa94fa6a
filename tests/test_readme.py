"""The README a newcomer finishes: short, its Python example runs as written, and every
reference page in docs/ is reachable from it (no page only a search finds)."""

import re
from pathlib import Path

from tests.test_examples import _cost_csv, _run

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 250


def _links(path: Path) -> list[str]:
    """Relative link targets of a Markdown file (no web addresses, no anchors alone)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; reference material belongs in docs/"


def test_the_readme_shows_code_early_and_carries_no_dated_findings():
    """A newcomer meets a command within the first screen; measured results live in the
    dated results log (docs/results.md), not in the README."""
    lines = README.read_text().splitlines()
    first_code = next(i for i, line in enumerate(lines, 1) if line.startswith("```"))
    assert first_code < 60, f"the first code block starts at line {first_code}"
    dated = [line for line in lines if re.search(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}|\(was ", line)]
    assert not dated, f"dated findings belong in docs/results.md: {dated}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t).resolve() for t in _links(README)}
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "docs/ has no pages"
    missing = [p.name for p in pages if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_every_relative_link_leads_somewhere():
    broken = [f"{md.relative_to(ROOT)} -> {t}" for md in [README, *sorted((ROOT / "docs").glob("*.md"))]
              for t in _links(md) if t and not (md.parent / t).exists()]
    assert not broken, f"broken links: {broken}"


def test_the_readme_python_example_runs_as_written(tmp_path):
    text = README.read_text()
    section = re.split(r"^#{2,3} From Python\n", text, maxsplit=1, flags=re.M)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.splitlines()) <= 30
    _cost_csv(tmp_path / "my_costs.csv")
    (tmp_path / "snippet.py").write_text(code)
    out = _run([str(tmp_path / "snippet.py")], tmp_path)
    assert re.search(r"^rule\s+\d", out, re.M) and re.search(r"^cost_linear\s+\d", out, re.M), out
    assert "champion: models:/modeswitch-router@champion" in out, out
    assert re.search(r"1,024 prompt tokens, 32 out: \w+", out), out
