"""The package has no import cycle: each module stands above everything it imports, so
the tree reads as the pipeline (imports under ``TYPE_CHECKING`` count too)."""

from __future__ import annotations

import grimp


def _cycle(imports: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the import graph, as the modules around it; ``None`` when acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(imports[module]):
            if state.get(imported) == 1:
                return [*path[path.index(imported) :], imported]
            if imported not in state and (found := visit(imported)) is not None:
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(imports):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle() -> None:
    graph = grimp.build_graph("tensortorrent_dynamo")
    # The root package is the public face: it hands the API's names on (lazily), and
    # modules reach the native extension (``from . import _planner``, which the graph sees
    # as an import of the root) and ``__version__`` through it. Every other module counts.
    root = "tensortorrent_dynamo"
    imports = {
        m: {i for i in graph.find_modules_directly_imported_by(m) if i not in (m, root)}
        for m in graph.modules
        if m != root
    }
    assert _cycle(imports) is None, " -> ".join(_cycle(imports) or [])
