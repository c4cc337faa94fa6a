"""Static analysis sees the installed namespace: mypy, run as ``make typecheck`` runs it
(scripts/typecheck.py: a symlink tree of the package-dir mapping on mypy's path),
resolves ``modeswitch.routers.api`` and every ``modeswitch.*`` module it imports."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed (pip install -e '.[dev]')")


@pytest.mark.slow  # mypy without its cache: minutes on a fresh clone (make test-slow)
def test_mypy_resolves_the_installed_namespace():
    """The repository's own tree and cache (build/), so a second run is incremental."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "typecheck.py")],
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    unresolved = [line for line in out.splitlines()
                  if "import-not-found" in line or "Cannot find implementation" in line]
    assert not unresolved, "\n".join(unresolved)
    assert proc.returncode == 0, out
    assert "Success" in out, out


def test_the_tree_follows_the_package_dir_mapping(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import typecheck
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    tree = typecheck.build_tree(tmp_path / "tree")
    for name, folder in typecheck.package_dirs().items():
        if name != "modeswitch":  # a real folder: the rooms sit in it beside its own entries
            assert tree.joinpath(*name.split(".")).resolve() == folder.resolve()
    assert (tree / "modeswitch" / "routers" / "api.py").is_file()
    assert (tree / "modeswitch" / "cli").resolve() == (ROOT / "modeswitch" / "cli").resolve()
    assert (tree / "modeswitch" / "__init__.py").resolve() == (ROOT / "modeswitch" / "__init__.py")
