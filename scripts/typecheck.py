"""Type-check the installed namespace (``make typecheck``).

The rooms (dataset/, engine/, oracle/, routers/) install as ``modeswitch.<room>``
through setuptools' package-dir mapping, and an editable install reaches them through
an import hook that static analysers do not run, so they cannot resolve
``from modeswitch.routers import api`` from the repository's layout. This script lays
that namespace out as a tree of symlinks (``build/typecheck/modeswitch/``: the mapped
rooms as directory links, ``modeswitch/``'s own entries linked one by one) and runs mypy
with the tree on its path (``mypy_path`` in pyproject.toml). Directory links keep the
tree current as files are added; the tree is laid anew on every run, so a new room or
a new entry in ``modeswitch/`` is picked up too.

The tree follows pyproject.toml's ``package-dir`` table, so the two cannot drift apart.
mypy follows imports silently (``follow_imports`` in pyproject.toml): the modules named
on the command line are checked, and a module that cannot be found is still an error.

    .venv/bin/python scripts/typecheck.py [--tree DIR] [--cache-dir DIR] [MODULE ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "typecheck"
CACHE = ROOT / "build" / "mypy-cache"
#: checked by default: the public router API and, through it, the imports it resolves
MODULES = ("modeswitch.routers.api",)


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """pyproject.toml's package-dir table: installed package name -> its folder."""
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: root / folder for name, folder in conf["package-dir"].items()}


def build_tree(tree: Path = TREE, root: Path = ROOT) -> Path:
    """Lay the installed namespace out under ``tree`` as symlinks; return ``tree``."""
    if tree.is_symlink() or tree.is_file():
        tree.unlink()
    elif tree.exists():
        shutil.rmtree(tree)  # removes the links, never what they point to
    mapping = package_dirs(root)
    # the outermost packages are real folders, so the packages mapped inside them
    # (modeswitch.routers in modeswitch) can sit beside their own files' links
    for name in sorted(mapping, key=lambda n: n.count(".")):
        dest = tree.joinpath(*name.split("."))
        mapped_inside = {n.rpartition(".")[2] for n in mapping if n.rpartition(".")[0] == name}
        if not mapped_inside:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(os.path.relpath(mapping[name], dest.parent), target_is_directory=True)
            continue
        dest.mkdir(parents=True)
        for entry in sorted(mapping[name].iterdir()):
            if entry.name not in mapped_inside and entry.name != "__pycache__":
                (dest / entry.name).symlink_to(os.path.relpath(entry, dest), entry.is_dir())
    return tree


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", default=list(MODULES), help="modules to check")
    ap.add_argument("--tree", type=Path, default=TREE, help="where to lay the symlink tree")
    ap.add_argument("--cache-dir", type=Path, default=CACHE,
                    help="mypy's incremental cache (outside the tree, which is laid anew each run)")
    args = ap.parse_args(argv)
    tree = build_tree(args.tree.resolve())
    env = {**os.environ, "MYPYPATH": str(tree)}  # also given here for a --tree outside build/
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
           "--cache-dir", str(args.cache_dir)]
    for m in args.modules:
        cmd += ["-m", m]
    return subprocess.run(cmd, cwd=tree, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
