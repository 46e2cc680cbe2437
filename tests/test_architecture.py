"""The package's shape, read from its source with `ast` (nothing is imported): no import cycle between modules,
no private name taken from another package, imports point down the layers, no module over 500 lines; and the
tests share helpers through tests/helpers.py only (no test imports another test file, no sys.path edits).

Every import counts, the ones inside functions too (a deferred import is still a dependency and still closes a
cycle), except those under `if TYPE_CHECKING:`, which never run. Each failure lists every violation found."""

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxrl_llm"
TESTS = Path(__file__).resolve().parent
MAX_LINES = 500

# Bottom to top. A module may import its own package and any package on a lower line, never one on its own line
# (peers stay independent) or above. Top-level modules are packages of their own (jaxrl_llm.config is "config"):
# the config is read by every layer (rl's update spec, rewards' scoring), so it sits at the bottom and names the
# registries of the layers above it without importing them.
LAYERS = [
    ("utils", "config", "hub"),
    ("parallel",),
    ("model",),
    ("sampling",),
    ("rl", "rewards"),
    ("data",),
    ("explore",),
    ("plan",),
    ("train",),
    ("bench", "ablate"),
    ("cli",),
]
RANK = {pkg: i for i, line in enumerate(LAYERS) for pkg in line}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    """jaxrl_llm.train.loop -> train; jaxrl_llm.config -> config; jaxrl_llm -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Import statements outside `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@functools.cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def _graph():
    """(edges: module -> {(imported module, line)}, private: [(importer, line, what)]), read once per session."""
    modules = _modules()
    edges = {m: set() for m in modules}
    private = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}  # local name -> jaxrl_llm module it is bound to, for `alias._name` uses
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("jaxrl_llm"):
                        target = _nearest(a.name, modules)
                        edges[module].add((target, node.lineno))
                        if a.asname:
                            aliases[a.asname] = a.name
                continue
            source = _resolve(module, path, node)
            if not source.startswith("jaxrl_llm"):
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                if sub in modules:  # `from jaxrl_llm.x import y` with y a module
                    edges[module].add((sub, node.lineno))
                    aliases[a.asname or a.name] = sub
                    target = sub
                else:
                    target = _nearest(source, modules)
                    edges[module].add((target, node.lineno))
                    if _private(a.name) and _package(target) != _package(module):
                        private.append((module, node.lineno, f"{source}.{a.name}"))
                if any(_private(p) for p in target.split(".")) and _package(target) != _package(module):
                    private.append((module, node.lineno, target))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and _private(node.attr) and _package(aliases[node.value.id]) != _package(module)):
                private.append((module, node.lineno, f"{aliases[node.value.id]}.{node.attr}"))
    return edges, private


def _nearest(name: str, modules: dict[str, Path]) -> str:
    """The module a dotted name lives in (the longest prefix that is a module of ours)."""
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def _cycles(edges) -> list[list[str]]:
    """One shortest cycle through each strongly connected component of more than one module (or a self-import)."""
    graph = {m: {t for t, _ in ts if t and t != m} for m, ts in edges.items()}
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]

    def visit(v):  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:
        members = set(comp)
        start = comp[0]
        prev, frontier = {start: None}, [start]
        found = None
        while frontier and not found:  # breadth first from `start` back to itself, inside the component
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found:
                    break
            frontier = nxt
        path = [found]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        cycle = list(reversed(path)) + [start]
        rest = sorted(members - set(cycle))  # the component's other modules, on other cycles through these
        cycles.append(cycle + ([f"(with {', '.join(map(_short, rest))})"] if rest else []))
    return cycles


def _short(module: str) -> str:
    return module.removeprefix("jaxrl_llm.")


def test_no_import_cycle():
    cycles = _cycles(_graph()[0])
    assert not cycles, "import cycles:\n" + "\n".join("  " + " -> ".join(map(_short, c)) for c in cycles)


def test_no_private_name_crosses_a_package():
    private = sorted(set(_graph()[1]))
    assert not private, "private names imported from another package:\n" + "\n".join(
        f"  {_short(m)} (line {line}) imports {_short(what)}" for m, line, what in private)


def test_imports_point_down_the_layers():
    modules = _modules()
    edges, _ = _graph()
    unplaced = sorted({_package(m) for m in modules} - set(RANK) - {""})
    wrong = []
    for module, targets in sorted(edges.items()):
        src = _package(module)
        for target, line in sorted(targets):
            dst = _package(target)
            if not dst or src == dst or src not in RANK or dst not in RANK:
                continue
            if RANK[dst] >= RANK[src]:
                how = "a peer" if RANK[dst] == RANK[src] else "a higher layer"
                wrong.append(f"  {_short(module)} (line {line}) imports {_short(target)}: {dst} is {how} than {src}")
    assert not unplaced, f"packages missing from LAYERS in {Path(__file__).name}: {unplaced}"
    order = " < ".join(", ".join(line) for line in LAYERS)
    assert not wrong, f"imports that do not point down ({order}):\n" + "\n".join(wrong)


def test_no_module_over_500_lines():
    long = sorted((n, m) for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES)
    assert not long, f"modules over {MAX_LINES} lines:\n" + "\n".join(f"  {_short(m)}: {n}" for n, m in long)


def test_tests_share_helpers_through_one_module():
    """Tests import tests/helpers.py (or the stand-in modules beside it), never a test file, and never edit sys.path."""
    test_modules = {p.stem for p in TESTS.rglob("test_*.py")}
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(ROOT)
        for node in _imports(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                last = name.split(".")[-1]
                if last in test_modules or last == "conftest":
                    wrong.append(f"  {where} (line {node.lineno}) imports {name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("insert", "append", "extend") and ast.unparse(node.func.value) == "sys.path"):
                wrong.append(f"  {where} (line {node.lineno}) edits sys.path")
    assert not wrong, "tests that import another test file or conftest, or edit sys.path:\n" + "\n".join(wrong)
