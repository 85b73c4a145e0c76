"""deploy/Dockerfile.cuda installs every package pdmesh's code imports, and the flashinfer
pyproject's gpu extra pins: a GPU image that cannot start (a module missing at import) is
caught here, on a machine without a GPU.

The import graph is every import statement in pdmesh/ and services/, lazy ones included
(a GPU worker reaches most of them); each imported module is traced to the distribution
that ships its file in this venv, and the Dockerfile's installs are closed over their
dependencies as this venv's metadata states them."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import shlex
import sys
import tomllib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile.cuda"
GPU_ONLY = {"flashinfer": "flashinfer-python"}
"""Modules this CPU venv cannot hold (the GPU extra), by the distribution that ships them."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules() -> dict[str, str]:
    """Every third-party module imported anywhere in the package, with one file importing it."""
    found: dict[str, str] = {}
    for root in ("pdmesh", "services"):
        for path in sorted((ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    # "from a.b import c": c may be a module (a namespace package's a.b has no file)
                    names = [f"{node.module}.{a.name}" for a in node.names]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("pdmesh", "services", "__future__"):
                        found.setdefault(name, str(path.relative_to(ROOT)))
    return found


@cache
def _module_owners() -> dict[str, str]:
    """Module path ("a/b" for a.b) -> the distribution holding its file (.py, package or extension)."""
    owners: dict[str, str] = {}
    for dist in md.distributions():
        name = _norm(dist.metadata["Name"])
        for f in dist.files or ():
            path = str(f)
            if path.endswith("/__init__.py"):
                owners.setdefault(path[: -len("/__init__.py")], name)
            elif path.endswith(".py"):
                owners.setdefault(path[:-3], name)
            elif path.endswith(".so"):
                owners.setdefault(path.split(".")[0], name)
    return owners


def provider(module: str) -> str | None:
    """The distribution whose files hold ``module`` (or its nearest parent that is a file)."""
    if module.split(".")[0] in GPU_ONLY:
        return GPU_ONLY[module.split(".")[0]]
    owners = _module_owners()
    parts = module.split(".")
    while parts:
        if "/".join(parts) in owners:
            return owners["/".join(parts)]
        parts.pop()
    return None


def dockerfile_installs(text: str) -> list[str]:
    """Every requirement a RUN line gives to pip install, as written (quotes removed)."""
    reqs: list[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        if not line.startswith("RUN "):
            continue
        for command in re.split(r"&&|;", line[4:]):
            words = shlex.split(command)
            if words[:2] != ["pip", "install"]:
                continue
            reqs += [w for w in words[2:] if not w.startswith("-") and w != "."]
    return reqs


def with_dependencies(names: set[str]) -> set[str]:
    """``names`` and everything they require, as this venv's metadata states it."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        todo += [_norm(re.split(r"[<>=!~\[; (]", r)[0]) for r in requires if "extra ==" not in r]
    return seen


def image_packages(dockerfile: str) -> set[str]:
    """The distributions an image built from ``dockerfile`` holds, dependencies included."""
    return with_dependencies({_norm(re.split(r"[<>=!~\[]", r)[0]) for r in dockerfile_installs(dockerfile)})


def test_the_cuda_image_installs_every_package_the_code_imports() -> None:
    installed = image_packages(DOCKERFILE.read_text())
    missing = []
    for module, where in sorted(imported_modules().items()):
        dist = provider(module)
        if dist is None or dist not in installed:
            missing.append(f"{module} (imported in {where}; from {dist or 'no distribution of this venv'})")
    assert missing == []


def test_the_cuda_image_pins_the_flashinfer_of_the_gpu_extra() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    pins = [r for r in dockerfile_installs(DOCKERFILE.read_text()) if r.startswith("flashinfer")]
    assert pins == [r for r in extra if r.startswith("flashinfer")] == ["flashinfer-python==0.6.18.post1"]


def test_the_check_sees_a_package_the_image_leaves_out() -> None:
    text = DOCKERFILE.read_text().replace(" fastapi", "")
    installed = image_packages(text)
    assert provider("fastapi") == "fastapi" and "fastapi" not in installed
