"""An import-cycle check that counts type-only imports.

import-linter builds its graph with grimp, which leaves out imports under ``if TYPE_CHECKING:`` by default, so a
cycle closed by a type-only import passes its contracts; mypy and a reader still see the cycle, and the first
annotation evaluated at run time (pydantic, ``typing.get_type_hints``) turns it into an ImportError. This check
reads every module's source with ``ast`` and counts every module-level import, inside ``if TYPE_CHECKING:`` or
not. Imports inside a function body run when the function is called, after every module has loaded, so they
are left out (they are the usual way to defer an import on purpose).

Algorithm: one edge from each module to each module it imports (``from pkg import name`` is an edge to
``pkg.name`` when that is a module of the tree, else to ``pkg``); imports of modules outside the given packages
are dropped; the cycles are the strongly connected components of more than one module (or a module importing
itself), found with Tarjan's algorithm, each reported with one closed path through it, e.g.
``a.x -> a.y -> a.x``.

Run by ``make lint``: ``python -m verl_devtools.import_cycles operator/verl_operator launcher/verl_launcher ...``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path


def module_files(package_dir: Path) -> dict[str, Path]:
    """Every module of the package at ``package_dir`` (a folder with ``__init__.py``), by dotted name."""
    root = package_dir.resolve()
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports run when the module loads (any depth of if/try/with at module level), type-only ones included."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    if isinstance(child, ast.ExceptHandler):
                        pending.extend(child.body)
                    else:
                        pending.append(child)


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` (at ``path``) imports at module level."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _module_level_imports(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        for target in targets:
            # `import a.b.c` names a.b.c; keep the longest prefix that is a module of the tree.
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts:
                found.add(".".join(parts))
    return found


def import_graph(package_dirs: Iterable[Path]) -> dict[str, set[str]]:
    """The module-level import graph of the given packages (edges only between their modules)."""
    files: dict[str, Path] = {}
    for package_dir in package_dirs:
        files.update(module_files(package_dir))
    known = set(files)
    return {module: imports_of(module, path, known) for module, path in sorted(files.items())}


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative, so a deep package cannot hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    result.append(sorted(component))
    return sorted(result)


def _closed_path(graph: dict[str, set[str]], component: Sequence[str]) -> list[str]:
    """One cycle through the component's first module, by breadth-first search inside the component."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for successor in sorted(graph[node] & members):
                if successor == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if successor not in parents:
                    parents[successor] = node
                    following.append(successor)
        frontier = following
    return [start, start]


def find_cycles(package_dirs: Iterable[Path]) -> list[list[str]]:
    """Each import cycle among the packages' modules, as a closed path (first module repeated at the end)."""
    graph = import_graph(package_dirs)
    return [_closed_path(graph, component) for component in _components(graph)]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m verl_devtools.import_cycles PACKAGE_DIR...", file=sys.stderr)
        return 2
    cycles = find_cycles(Path(arg) for arg in args)
    for cycle in cycles:
        print("import cycle (type-only imports count): " + " -> ".join(cycle), file=sys.stderr)
    if cycles:
        print(
            f"{len(cycles)} import cycle(s); move the shared names into a module both sides import",
            file=sys.stderr,
        )
        return 1
    print(f"no import cycles in {', '.join(args)} (type-only imports counted)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
