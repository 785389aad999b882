"""The import graph of the `salon` package, read from its source with `ast` (nothing of it is imported).

The graph has one node per module (salon/x/y.py is salon.x.y, salon/x/__init__.py is salon.x) and
an edge for each import that runs when the module is first imported:

  * module-level statements only, including those nested in `if`/`try`/`with` blocks and class bodies
    (they run at import too); imports inside functions and methods run later, on a call, and the
    body of an `if TYPE_CHECKING:` block never runs: neither makes an edge;
  * `import a.b.c` and `from a.b.c import x` make an edge to a.b.c; `from a.b import c` makes it to
    the submodule a.b.c when that file exists, else to the package a.b (c is then a name in its
    __init__); relative imports are resolved against the importing module's package first;
  * importing a.b.c also runs a/__init__ and a/b/__init__, so it makes an edge to each of those
    packages too, except to the packages that contain the importing module itself: Python has
    begun running those before the module, and a package's __init__ importing its own submodules
    is the normal way in, not a cycle. An import that names such a package explicitly (a name taken
    from its __init__) keeps its edge, since that name may not exist yet while the __init__ runs;
  * only modules of `salon` are nodes: imports of the standard library and third parties are dropped.

`import_graph(at_import_only=False)` makes edges of the deferred imports too (inside functions, under
TYPE_CHECKING).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "salon"


@dataclass(frozen=True)
class Import:
    """One import statement's target: `module` (dotted, absolute) and, for `from m import n`, the names."""

    module: str
    names: tuple[str, ...]
    runs_at_import: bool


def module_files(root: Path = REPO / PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(statements: list[ast.stmt], at_import: bool = True) -> Iterator[tuple[ast.stmt, bool]]:
    """Each import statement among `statements` and the blocks inside them, with whether it runs when
    the module is imported."""
    for node in statements:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, at_import
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from imports_of(node.body, False)
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            yield from imports_of(node.body, False)
            yield from imports_of(node.orelse, at_import)
        else:
            yield from imports_of(inner_statements(node), at_import)


def inner_statements(node: ast.stmt) -> list[ast.stmt]:
    """The statements of a block statement (if, try, with, for, while, match, class body)."""
    inner = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            inner.append(child)
        elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
            inner.extend(child.body)
    return inner


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names, relative levels resolved."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def parse_imports(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node, at_import in imports_of(tree.body):
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, (), at_import) for alias in node.names)
        else:
            target = resolve(module, path.name == "__init__.py", node)
            found.append(Import(target, tuple(alias.name for alias in node.names), at_import))
    return found


def nearest_module(name: str, modules: dict[str, Path]) -> str | None:
    """`name` if it is a module of the package, else its closest enclosing one (None: not ours)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def explicit_targets(imp: Import, modules: dict[str, Path]) -> set[str]:
    """The modules an import names: `from pkg import sub` is the submodule pkg.sub when it exists."""
    if not imp.names:
        target = nearest_module(imp.module, modules)
        return {target} if target else set()
    targets = set()
    for name in imp.names:
        submodule = f"{imp.module}.{name}"
        target = submodule if submodule in modules else nearest_module(imp.module, modules)
        if target:
            targets.add(target)
    return targets


def containing_packages(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def edges_of(module: str, imports: list[Import], modules: dict[str, Path], at_import_only: bool) -> set[str]:
    """The modules `module` depends on through `imports` (see the module docstring for the rule)."""
    own = set(containing_packages(module)) | {module}
    edges = set()
    for imp in imports:
        if at_import_only and not imp.runs_at_import:
            continue
        for target in explicit_targets(imp, modules):
            edges.add(target)
            edges.update(p for p in containing_packages(target) if p in modules and p not in own)
    edges.discard(module)
    return edges


def import_graph(
    at_import_only: bool = True, root: Path = REPO / PACKAGE
) -> tuple[dict[str, set[str]], dict[str, Path]]:
    """The graph (module -> the modules it imports) and each module's file."""
    modules = module_files(root)
    graph = {name: edges_of(name, parse_imports(name, path), modules, at_import_only) for name, path in modules.items()}
    return graph, modules


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm without recursion; components of one node count only with a self edge."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    components.append(sorted(component))
    return components
