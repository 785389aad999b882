"""The engine's layers point only down, and the engine imports no other service.

Bottom to top:

    model, config, metrics, resident   the model and the engine's settings and gauges
    request.py, batch.py, grammar/     a request's state and its constraint; what the scheduler hands the runner
    kv/                                the paged cache tensors, their layout and block bookkeeping
    prefix/                            the device and host prefix caches and the policy over them
    worker/                            running a step: attention metadata, the model call, sampling
    core/                              the scheduler, the output states, the step loop
    api/ (and __main__)                the gRPC edge

A module may import its own layer or a lower one at module level. Imports under `if TYPE_CHECKING:` and
inside functions are not counted: they run after every module is loaded, or never. The graph is
tests/import_graph.py's, read from the source, so a module that fails to import is still checked.
"""

from __future__ import annotations

from tests.import_graph import import_graph, strongly_connected_components

ENGINE = "salon.engine"

# Module prefix -> layer, lowest first; a module's layer is that of its longest matching prefix.
LAYERS = {
    "salon.engine": 0,
    "salon.engine.config": 0,
    "salon.engine.metrics": 0,
    "salon.engine.resident": 0,
    "salon.engine.model": 0,
    "salon.engine.request": 1,
    "salon.engine.grammar": 1,
    "salon.engine.batch": 1,
    "salon.engine.kv": 2,
    "salon.engine.prefix": 3,
    "salon.engine.worker": 4,
    "salon.engine.core": 5,
    "salon.engine.api": 6,
    "salon.engine.__main__": 6,
}

OTHER_SERVICES = ("salon.gateway", "salon.kvstore", "salon.cli", "salon.loadgen")


def in_engine(module: str) -> bool:
    return module == ENGINE or module.startswith(ENGINE + ".")


def layer(module: str) -> int:
    prefixes = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    assert prefixes, f"{module} is in no layer: add it to LAYERS"
    return LAYERS[max(prefixes, key=len)]


def engine_graph(at_import_only: bool = True) -> dict[str, set[str]]:
    """Each engine module -> the modules of salon it imports (at import only: module-level, not under
    TYPE_CHECKING)."""
    graph, _ = import_graph(at_import_only)
    return {module: targets for module, targets in graph.items() if in_engine(module)}


def upward_imports() -> list[str]:
    return [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in sorted(engine_graph().items())
        for target in sorted(targets)
        if in_engine(target) and layer(target) > layer(module)
    ]


def test_every_engine_module_has_a_layer():
    for module in engine_graph():
        layer(module)


def test_engine_imports_point_only_down():
    assert upward_imports() == []


def test_engine_has_no_import_cycle():
    graph = {module: {t for t in targets if in_engine(t)} for module, targets in engine_graph().items()}
    assert strongly_connected_components(graph) == []


def test_engine_imports_no_other_service():
    # Anywhere in the module, functions included: the engine ships without the other services.
    found = [
        f"{module} imports {target}"
        for module, targets in sorted(engine_graph(at_import_only=False).items())
        for target in sorted(targets)
        if any(target == s or target.startswith(s + ".") for s in OTHER_SERVICES)
    ]
    assert found == []
