"""Strongly connected components of a directed graph (Tarjan's algorithm), for the cycle checks.

``tools/rust_module_cycles.py`` and ``tools/python_import_cycles.py`` both report every component
of two or more nodes as a cycle.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Mapping
from typing import TypeVar

Node = TypeVar("Node", bound=Hashable)


def components(edges: Mapping[Node, Mapping[Node, object]]) -> list[list[Node]]:
    """The strongly connected components of two or more nodes, each sorted, in discovery order."""
    index: dict[Node, int] = {}
    low: dict[Node, int] = {}
    stack: list[Node] = []
    on_stack: set[Node] = set()
    found: list[list[Node]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(node: Node) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in edges.get(node, {}):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))  # type: ignore[type-var]  # nodes sort

    for node in sorted(edges):  # type: ignore[type-var]
        if node not in index:
            visit(node)
    return found
