"""The layout keeps its promises: no import cycles, the library never reaches up into the
services, generated protobuf code stays at the RPC boundary, and the router and kvstore
start without torch or NIXL."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
COMPOSITION_ROOTS = ("pdmesh.cli", "pdmesh.bench", "pdmesh.__main__")
"""Entry points that start or drive services; they may import them (nothing imports them back)."""
PROTO_BOUNDARY = ("pdmesh.rpc.", "pdmesh.client")
"""Besides these, only ``services/<role>/servicer.py`` modules may import ``pdmesh.v1``."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    out = {}
    for top in ("pdmesh", "services"):
        for path in (ROOT / top).rglob("*.py"):
            if "v1" not in path.relative_to(ROOT).parts:
                out[_module_name(path)] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: set[str], type_checking: bool) -> set[str]:
    """Project modules ``path`` imports anywhere (functions included); with ``type_checking``
    also those under ``if TYPE_CHECKING:``, which tie two modules together as much for a
    cycle (the router's request path once hid a seven-module circle that way)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if not type_checking and _is_type_checking(node):
            assert isinstance(node, ast.If)
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m.split(".")[0] in ("pdmesh", "services")}


def _graph(type_checking: bool = True) -> dict[str, set[str]]:
    """Module -> the project modules it imports; ``type_checking=False``: those it imports
    when it runs."""
    sources = _sources()
    names = set(sources) | {f"pdmesh.v1.{p.stem}" for p in (ROOT / "pdmesh/v1").glob("*.py")}
    return {mod: _imports(path, names, type_checking) for mod, path in sources.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_router_request_path_sits_below_the_router() -> None:
    """``services/router/request/`` is what one request does; the router's core, servers
    and fronts create it, and it reaches them only through ``request/mesh.py``'s interface.
    Inside it, only the completions above the flow import the flow."""
    graph = _graph()
    above = ("services.router.router", "services.router.server", "services.router.servicer",
             "services.router.http", "services.router.metrics")
    offenders = sorted(
        f"{mod} imports {dep}" for mod, deps in graph.items() for dep in deps
        if mod.startswith("services.router.request.") and (
            dep.startswith(above) or (dep == "services.router.request.flow"
                                      and mod != "services.router.request.completions"))
    )
    assert offenders == []
    assert "services.router.request.state" in graph["services.router.request.flow"]


def test_the_library_does_not_import_the_services() -> None:
    offenders = sorted(
        f"{mod} imports {dep}" for mod, deps in _graph().items() for dep in deps
        if mod.startswith("pdmesh") and dep.startswith("services")
        and not mod.startswith(COMPOSITION_ROOTS)
    )
    assert offenders == []


def test_nothing_imports_the_composition_roots() -> None:
    offenders = sorted(
        f"{mod} imports {dep}" for mod, deps in _graph().items() for dep in deps
        if dep.startswith(COMPOSITION_ROOTS) and not mod.startswith(COMPOSITION_ROOTS)
    )
    assert offenders == []


def test_generated_protobuf_code_stays_at_the_boundary() -> None:
    def allowed(mod: str) -> bool:
        return mod.startswith(PROTO_BOUNDARY) or (mod.startswith("services.") and mod.endswith(".servicer"))

    # What runs: a generated message named in an annotation (``-> GenerateResponse``) is
    # built by the boundary's code, not here.
    offenders = sorted(
        f"{mod} imports {dep}" for mod, deps in _graph(type_checking=False).items() for dep in deps
        if dep.startswith("pdmesh.v1") and not allowed(mod)
    )
    assert offenders == []


def test_the_walker_sees_real_imports() -> None:
    """Guards the tests above against passing vacuously."""
    graph = _graph()
    assert "pdmesh.engine.llm_engine" in graph["pdmesh.engine.async_engine"]
    assert "pdmesh.v1.worker_pb2" in graph["services.decode.servicer"]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    # An import under TYPE_CHECKING counts: the request path's state names the router
    # only through request/mesh.py's interface, which names its types that way.
    assert "services.router.registry" in graph["services.router.request.mesh"]


@pytest.mark.parametrize("module", ["services.router.server", "services.kvstore.server"])
def test_router_and_kvstore_start_without_torch_or_nixl(module: str) -> None:
    code = (f"import sys, {module}; "
            "heavy = sorted(m for m in ('torch', 'nixl', 'nixl_cu13') if m in sys.modules); "
            "print(heavy); sys.exit(1 if heavy else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

