"""deploy/ cannot drift from the code: every command line in it must pass the CLI's own
parsing and config validation, and the dashboard may only chart metrics the code exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from pdmesh.cli import _service_config, build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_CONFIGS = {
    "router": ("services.router.config", "RouterConfig", "PDMESH_ROUTER_"),
    "prefill": ("services.worker.config", "WorkerConfig", "PDMESH_WORKER_"),
    "decode": ("services.worker.config", "WorkerConfig", "PDMESH_WORKER_"),
    "kvstore": ("services.kvstore.config", "KVStoreConfig", "PDMESH_KVSTORE_"),
}


def _commands(doc, found: list[list[str]]) -> None:  # type: ignore[no-untyped-def]
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "command" and isinstance(value, list) and value and value[0] == "pdmesh":
                found.append([str(v) for v in value])
            else:
                _commands(value, found)
    elif isinstance(doc, list):
        for item in doc:
            _commands(item, found)


def _deploy_commands() -> list[tuple[str, list[str], dict[str, str]]]:
    out = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        config_files = {}
        for d in docs:
            if d.get("kind") == "ConfigMap":
                config_files.update(d["data"])
        found: list[list[str]] = []
        _commands(docs, found)
        out += [(path.name, cmd, config_files) for cmd in found]
    return out


COMMANDS = _deploy_commands()


def test_deploy_files_have_commands_for_every_role() -> None:
    roles = {cmd[1] for _, cmd, _ in COMMANDS}
    assert {"router", "prefill", "decode", "kvstore"} <= roles


@pytest.mark.parametrize(("source", "cmd", "configs"), COMMANDS,
                         ids=[f"{s}:{c[1]}:{i}" for i, (s, c, _) in enumerate(COMMANDS)])
def test_every_deploy_command_is_accepted_by_the_cli(source, cmd, configs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import importlib

    argv = [a.replace("$(POD_NAME)", f"{cmd[1]}-0") for a in cmd[1:]]
    if "--config" in argv:
        i = argv.index("--config") + 1
        name = Path(argv[i]).name
        assert name in configs, f"{source}: {argv[i]} is not in a ConfigMap"
        (tmp_path / name).write_text(configs[name])
        argv[i] = str(tmp_path / name)
    args = build_parser().parse_args(argv)
    if cmd[1] in _CONFIGS:
        module, cls_name, prefix = _CONFIGS[cmd[1]]
        cls = getattr(importlib.import_module(module), cls_name)
        if cmd[1] in ("prefill", "decode"):
            args.role = cmd[1]
        cfg = _service_config(args, cls, prefix)  # raises on unknown or ill-typed options
        assert cfg.model


def test_dashboard_charts_only_exported_metrics() -> None:
    dash = json.loads((DEPLOY / "grafana" / "pdmesh-dashboard.json").read_text())
    code = "\n".join(p.read_text() for p in (DEPLOY.parent / "pdmesh").rglob("*.py"))
    code += "\n".join(p.read_text() for p in (DEPLOY.parent / "services").rglob("*.py"))
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    names = {re.sub(r"_(bucket|total|count|sum)$", "", n) for e in exprs for n in re.findall(r"pdmesh_[a-z_]+", e)}
    assert names
    for name in names:
        assert f'"{name}"' in code, f"dashboard charts {name}, which no service exports"
