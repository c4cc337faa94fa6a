"""One installed namespace: the rooms (engine/ dataset/ oracle/ routers/) keep their
folders but install as ``modeswitch.engine``, ... (setuptools' package-dir mapping), so
``pip install .`` puts nothing but ``modeswitch*`` at the top of site-packages, and no
file imports a room by its bare name (which would load a second copy of it, with its
own registries, wherever the repository root is on the path)."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("dataset", "engine", "oracle", "routers")
SOURCES = ("modeswitch", *ROOMS, "tests", "bench", "scripts", "examples")


def _bare_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        out += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in ROOMS]
    return out


def test_no_file_imports_a_room_by_its_bare_name():
    found = [hit for d in SOURCES for p in sorted((ROOT / d).rglob("*.py"))
             if "__pycache__" not in p.parts for hit in _bare_imports(p)]
    assert not found, "import these as modeswitch.<room>: " + "; ".join(found)


def test_the_package_list_is_the_folders():
    """pyproject.toml lists packages explicitly (package-dir mapping needs it): every
    folder holding Python files under modeswitch/ and the rooms, and nothing else."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = set()
    for top in ("modeswitch", *ROOMS):
        for d in [ROOT / top, *(ROOT / top).rglob("*")]:
            if d.is_dir() and "__pycache__" not in d.parts and any(d.glob("*.py")):
                prefix = ("modeswitch",) if top == "modeswitch" else ("modeswitch", top)
                folders.add(".".join((*prefix, *d.relative_to(ROOT / top).parts)))
    assert set(conf["packages"]) == folders
    assert conf["package-dir"] == {"modeswitch": "modeswitch", **{f"modeswitch.{r}": r for r in ROOMS}}


def test_pip_install_puts_only_modeswitch_at_the_top(tmp_path):
    """``pip install .`` (without dependencies: the layout is under test, not the
    resolver) into an empty target: only ``modeswitch`` and its dist-info at the top
    (and ``bin/`` for the console script), the rooms inside, the C kernel with them."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "pyproject.toml", "README.md",
                            "modeswitch", *ROOMS], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes((ROOT / f).read_bytes())
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "--target", str(target), str(src)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode and "No module named pip" in proc.stderr:
        pytest.skip("no pip in this interpreter")
    assert proc.returncode == 0, proc.stderr
    top = sorted(p.name for p in target.iterdir())
    assert all(n.startswith("modeswitch") or n == "bin" for n in top), top
    for room in ROOMS:
        assert (target / "modeswitch" / room / "__init__.py").is_file()
    assert (target / "modeswitch" / "routers" / "compiler" / "native" / "kernels.c").is_file()
    assert (target / "modeswitch" / "routers" / "training" / "trainer.py").is_file()  # a namespace package
