"""The shape of the `salon` package, read from its source with `ast` (nothing of it is imported).

The import graph and its rule: tests/import_graph.py.

Rules asserted:

  (a) the graph has no cycle; each strongly connected component is reported with its files. A second
      check counts the deferred imports too (inside functions, under TYPE_CHECKING): one that closes
      a cycle does not fail at import, but it hides two modules that cannot be understood apart;
  (b) a service depends only on shared code: salon.gateway and salon.kvstore import only themselves,
      salon.common and the generated stubs (salon.api); salon.engine also the kernels
      (salon.kernels); salon.common only itself and salon.api; salon.kernels only itself.
      Here every import counts, also those inside functions and TYPE_CHECKING blocks: a deferred
      import is still a dependency;
  (c) everything ships in the one namespace: no top-level `services`, `kernels` or `salon_cli`
      folder, and the packages that pyproject.toml finds are `salon` and its subpackages only.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

from tests.import_graph import PACKAGE, REPO, import_graph, strongly_connected_components

# Which top-level parts of salon each constrained part may import (rule b).
ALLOWED_IMPORTS = {
    "salon.gateway": ("salon.gateway", "salon.common", "salon.api"),
    "salon.kvstore": ("salon.kvstore", "salon.common", "salon.api"),
    "salon.engine": ("salon.engine", "salon.common", "salon.api", "salon.kernels"),
    "salon.common": ("salon.common", "salon.api"),
    "salon.kernels": ("salon.kernels",),
}
# Folders that held code before it moved under salon/ (rule c).
FORMER_TOP_LEVEL = ("services", "kernels", "salon_cli")


def part_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def cycle_report(graph: dict[str, set[str]], modules: dict[str, Path]) -> str:
    return "\n".join(
        "cycle among: " + ", ".join(str(modules[m].relative_to(REPO)) for m in component)
        for component in strongly_connected_components(graph)
    )


def test_no_import_cycle() -> None:
    graph, modules = import_graph()
    report = cycle_report(graph, modules)
    assert not report, report


def test_no_cycle_closed_by_a_deferred_import() -> None:
    graph, modules = import_graph(at_import_only=False)
    report = cycle_report(graph, modules)
    assert not report, report


def test_services_import_only_shared_code() -> None:
    graph, modules = import_graph(at_import_only=False)
    wrong = []
    for module, targets in sorted(graph.items()):
        allowed = ALLOWED_IMPORTS.get(part_of(module))
        if allowed is None:
            continue
        for target in sorted(targets):
            if target != PACKAGE and part_of(target) not in allowed:
                wrong.append(f"{modules[module].relative_to(REPO)} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_one_namespace() -> None:
    assert [name for name in FORMER_TOP_LEVEL if (REPO / name).exists()] == []
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(str(REPO), include=find["include"], exclude=find.get("exclude", ()))
    assert PACKAGE in packages
    assert [p for p in packages if p != PACKAGE and not p.startswith(PACKAGE + ".")] == []


def test_the_cycle_check_sees_a_cycle(tmp_path) -> None:
    """The rule itself: a cycle through module-level imports is found, deferred imports and the
    package's own __init__ are not."""
    package = tmp_path / PACKAGE
    (package / "common").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "common" / "__init__.py").write_text("from salon.common import a\n")
    (package / "common" / "a.py").write_text("from salon.common.b import x\n")
    (package / "common" / "b.py").write_text("from salon.common import c\nx = 1\n")
    (package / "common" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from salon.common import b\n"
        "def later():\n    from salon.common import a\n"
    )
    graph, _ = import_graph(root=package)
    assert strongly_connected_components(graph) == []
    (package / "common" / "c.py").write_text("import salon.common.a\n")
    graph, _ = import_graph(root=package)
    assert strongly_connected_components(graph) == [["salon.common.a", "salon.common.b", "salon.common.c"]]
