"""The codebase's shape: small files, no import cycles, and imports that only run down the layers
(core < tasks < eval < prompts < proposers < search < driver < commands). Every import counts,
also those inside functions; only `if TYPE_CHECKING:` imports (annotations) are exempt."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "kfray"
MAX_LINES = 400
LAYERS = [
    ("core", ("kfray", "kfray.errors", "kfray.candidate", "kfray.source", "kfray.languages", "kfray.descriptors",
              "kfray.proposal", "kfray.config", "kfray.cluster", "kfray.store")),
    ("tasks", ("kfray.tasks", "kfray.suites")),
    ("eval", ("kfray.eval",)),
    ("prompts", ("kfray.prompts",)),
    ("proposers", ("kfray.proposers",)),
    ("search", ("kfray.search",)),
    ("driver", ("kfray.driver",)),
    ("commands", ("kfray.sweep", "kfray.report", "kfray.verify", "kfray.cli")),
]


def modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def layer(mod: str) -> int:
    best, idx = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > best:
                best, idx = len(p), i
    return idx


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {}
    for m, f in mods.items():
        tree = ast.parse(f.read_text())
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for n in ast.walk(node)}
        pkg = m if f.name == "__init__.py" else m.rpartition(".")[0]
        out = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                out |= {resolve(a.name) for a in node.names if a.name.startswith("kfray")}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if base.startswith("kfray"):
                    out |= {resolve(f"{base}.{a.name}") if f"{base}.{a.name}" in mods else resolve(base)
                            for a in node.names}
        edges[m] = out - {m, ""}
    return edges


def test_no_file_in_kfray_is_over_400_lines():
    big = {str(f.relative_to(PKG.parent)): n for f in PKG.rglob("*.py")
           if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not big, f"files over {MAX_LINES} lines: {big}"


def test_no_import_cycles():
    edges = imports(modules())
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
                cycles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_run_down_the_layers_only():
    mods = modules()
    unplaced = sorted(m for m in mods if layer(m) < 0)
    assert not unplaced, f"modules in no layer: {unplaced}"
    up = [f"{m} ({LAYERS[layer(m)][0]}) -> {d} ({LAYERS[layer(d)][0]})"
          for m, ds in imports(mods).items() for d in ds
          if layer(d) > layer(m) and not (m == "kfray" or d.startswith(m + "."))]
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(up))


def test_every_package_states_its_public_names():
    missing = [str(f.relative_to(PKG.parent)) for f in PKG.rglob("__init__.py")
               if "suites" not in f.parts and "__all__" not in f.read_text()]
    assert not missing, f"packages without __all__: {missing}"


def test_the_layering_check_sees_a_cycle_and_an_upward_import(tmp_path):
    """The checks above can fail: a planted cycle and a planted upward import are found."""
    mods = {"kfray.candidate": tmp_path / "a.py", "kfray.store": tmp_path / "b.py",
            "kfray.driver.x": tmp_path / "c.py"}
    mods["kfray.candidate"].write_text("from kfray.store import Store\nfrom kfray.driver.x import y\n")
    mods["kfray.store"].write_text("def f():\n    import kfray.candidate\n")
    mods["kfray.driver.x"].write_text("y = 1\n")
    edges = imports(mods)
    assert edges["kfray.candidate"] == {"kfray.store", "kfray.driver.x"} and edges["kfray.store"] == {"kfray.candidate"}
    assert layer("kfray.driver.x") > layer("kfray.candidate")
