"""The engine's layers point only down, and the engine imports no other service.

Bottom to top:

    model, config, metrics, resident   the model and the engine's settings and gauges
    request.py, batch.py               a request's state; what the scheduler hands the runner
    kv/                                the paged cache tensors, their layout and block bookkeeping
    prefix/                            the device and host prefix caches and the policy over them
    worker/                            running a step: attention metadata, the model call, sampling
    core/                              the scheduler, the output states, the step loop
    api/ (and __main__)                the gRPC edge

A module may import its own layer or a lower one at module level. Imports under `if TYPE_CHECKING:` and
inside functions are not counted: they run after every module is loaded, or never. The parser reads the
source, so a module that fails to import is still checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "salon" / "engine"

# Module prefix -> layer, lowest first; a module's layer is that of its longest matching prefix.
LAYERS = {
    "salon.engine": 0,
    "salon.engine.config": 0,
    "salon.engine.metrics": 0,
    "salon.engine.resident": 0,
    "salon.engine.model": 0,
    "salon.engine.request": 1,
    "salon.engine.batch": 1,
    "salon.engine.kv": 2,
    "salon.engine.prefix": 3,
    "salon.engine.worker": 4,
    "salon.engine.core": 5,
    "salon.engine.api": 6,
    "salon.engine.__main__": 6,
}

OTHER_SERVICES = ("salon.gateway", "salon.kvstore", "salon.cli", "salon.loadgen")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ENGINE.parents[1]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> int:
    prefixes = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    assert prefixes, f"{module} is in no layer: add it to LAYERS"
    return LAYERS[max(prefixes, key=len)]


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported: not in functions or classes, not under
    `if TYPE_CHECKING:` (its else branch does run)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if not is_type_checking(node.test):
                found += module_level_imports(node.body)
            found += module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            found += module_level_imports(node.body) + module_level_imports(node.orelse)
            found += module_level_imports(node.finalbody)
            for handler in node.handlers:
                found += module_level_imports(handler.body)
        elif isinstance(node, ast.With):
            found += module_level_imports(node.body)
    return found


def imported_modules(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The modules an import statement runs: `from p import x` runs package p (its __init__ may import its
    children), and p.x too when x is a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    names = [source]
    for alias in node.names:
        candidate = f"{source}.{alias.name}"
        path = ENGINE.parents[1].joinpath(*candidate.split("."))
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            names.append(candidate)
    return names


def engine_modules() -> list[tuple[str, ast.Module, bool]]:
    return [
        (module_name(p), ast.parse(p.read_text(), str(p)), p.name == "__init__.py")
        for p in sorted(ENGINE.rglob("*.py"))
    ]


def upward_imports() -> list[str]:
    problems = []
    for module, tree, is_package in engine_modules():
        for node in module_level_imports(tree.body):
            for target in imported_modules(node, module, is_package):
                if target.startswith("salon.engine") and target != module and layer(target) > layer(module):
                    problems.append(
                        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)}) "
                        f"at line {node.lineno}"
                    )
    return problems


def import_cycle() -> list[str]:
    """One cycle of module-level imports among the engine's modules, or [] (a layer may not import itself
    round: the module imported first would run against a half-initialised one)."""
    graph: dict[str, set[str]] = {}
    for module, tree, is_package in engine_modules():
        targets = [t for node in module_level_imports(tree.body) for t in imported_modules(node, module, is_package)]
        graph[module] = {t for t in targets if t.startswith("salon.engine") and t != module}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return []


def test_every_engine_module_has_a_layer():
    for module, _, _ in engine_modules():
        layer(module)


def test_engine_imports_point_only_down():
    assert upward_imports() == []


def test_engine_has_no_import_cycle():
    assert import_cycle() == []


def test_engine_imports_no_other_service():
    found = []
    for module, tree, is_package in engine_modules():
        # Anywhere in the module, functions included: the engine ships without the other services.
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [
                    f"{module} imports {t}"
                    for t in imported_modules(node, module, is_package)
                    if any(t == s or t.startswith(s + ".") for s in OTHER_SERVICES)
                ]
    assert found == []
