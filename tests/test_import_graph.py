"""No import circle between the project's files, counting every import (function-local
ones included): rooms import one way, and a file's dependencies can be read without
meeting the file again."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "dataset", "oracle", "routers", "modeswitch")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[Path, set[Path]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts]
    by_module = {_module_of(p): p for p in files}

    def resolve(name: str):
        """The file a dotted name imports: the module itself, else its package. An
        installed name (``modeswitch.engine.x``) is the folder's (``engine.x``): tried
        first, so it does not stop at ``modeswitch/__init__.py``."""
        bare = name.removeprefix("modeswitch.")
        for cand in ((bare, name) if bare.split(".")[0] in PACKAGES else (name,)):
            while cand:
                if cand in by_module:
                    return by_module[cand]
                cand = cand.rpartition(".")[0]
        return None

    graph = {}
    for path in files:
        module = _module_of(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                # "from pkg import sub" imports the submodule sub; "from pkg import name" pkg
                names = [f"{base}.{a.name}" if {f"{base}.{a.name}", f"{base}.{a.name}".removeprefix("modeswitch.")}
                         & by_module.keys() else base for a in node.names]
            else:
                continue
            targets |= {t for t in map(resolve, names) if t is not None and t != path}
        graph[path] = targets
    return graph


def _cycles(graph: dict) -> list[list[Path]]:
    """Strongly connected groups of two or more files (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    group = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        group.append(w)
                        if w == v:
                            break
                    if len(group) > 1:
                        out.append(group)
    return out


def test_no_file_imports_itself_through_others():
    cycles = [sorted(str(p.relative_to(ROOT)) for p in group) for group in _cycles(_import_graph())]
    assert not cycles, f"import cycles: {cycles}"


def test_the_graph_sees_function_local_imports():
    """The check would be empty if it missed imports inside functions."""
    graph = _import_graph()
    trainer = ROOT / "routers" / "training" / "trainer.py"
    assert ROOT / "routers" / "training" / "tracking.py" in graph[trainer]  # imported inside functions


def test_scoring_reads_the_training_table_not_the_trainer():
    graph = _import_graph()
    trainer = ROOT / "routers" / "training" / "trainer.py"
    assert not [p for p in (ROOT / "routers" / "scoring").glob("*.py") if trainer in graph[p]]
