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
HELM = DEPLOY / "helm"
"""Templates, not YAML: checked through their renderings in deploy/k8s."""
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
    for path in sorted(p for p in DEPLOY.rglob("*.yaml") if HELM not in p.parents):
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


def _render_script():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_chart", DEPLOY.parent / "scripts" / "render_chart.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_k8s_manifests_are_the_helm_charts_renderings() -> None:
    """deploy/k8s/pdmesh.yaml (TLS) and pdmesh-plaintext.yaml are the chart rendered with its
    defaults and with tls.enabled=false; a chart edit without a re-render fails here."""
    assert _render_script().main(["--check"]) == 0


def test_the_chart_renderer_refuses_what_it_does_not_implement() -> None:
    render = _render_script()
    assert render.render("a: {{ .Values.x | quote }}\n{{- if not .Values.y }}\nb: 1\n{{- else }}\nb: 2\n{{- end }}\n",
                         {"x": 3, "y": False}) == 'a: "3"\nb: 1\n'
    for bad in ("{{ include \"x\" . }}", "{{- range .Values.x }}{{- end }}", "{{ .Values.x -}}", "{{- if .Values.x }}"):
        with pytest.raises(render.TemplateError):
            render.render(bad, {"x": [1]})


def _manifests(name: str) -> list[dict]:  # type: ignore[type-arg]
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if d]


@pytest.mark.parametrize("name", ["pdmesh.yaml", "pdmesh-plaintext.yaml"])
def test_every_worker_pod_has_its_own_gpu_a_startup_probe_and_the_router_serves_http(name: str) -> None:
    docs = _manifests(name)
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
    for role in ("prefill", "decode"):
        (container,) = pods[role]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 600
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/var/cache/pdmesh", "/var/cache/huggingface"} <= mounts  # kernels and hub downloads kept
    for role, spec in pods.items():
        if role == "redis":
            continue
        (container,) = spec["containers"]
        exposed = {p["containerPort"] for p in container["ports"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container:
                p = container[probe]
                port = p["grpc"]["port"] if "grpc" in p else int(p["exec"]["command"][2].rsplit(":", 1)[1])
                assert port in exposed, (role, probe)
                assert ("exec" in p) == (name == "pdmesh.yaml")  # kubelet's gRPC probe speaks no TLS
    router_service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "router")
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["router.yaml"])
    assert {p["port"] for p in router_service["spec"]["ports"]} == {config["port"], config["http_port"]}
    assert ("tls_cert" in config) == (name == "pdmesh.yaml")


def test_compose_gpu_gives_each_worker_its_own_device_and_the_router_its_http_front() -> None:
    gpu = yaml.safe_load((DEPLOY / "compose.gpu.yaml").read_text())["services"]
    ids = [gpu[s]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
           for s in ("prefill-0", "prefill-1", "decode-0")]
    assert ids == [["0"], ["1"], ["2"]]
    cpu = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert "8000:8000" in cpu["router"]["ports"] and "--http-port" in cpu["router"]["command"]


def test_the_tls_secret_script_makes_material_pdmeshs_mutual_tls_accepts(tmp_path: Path) -> None:
    """The script's CA and certificate, through a real server and client of pdmesh's own
    (mutual TLS, dialled at 127.0.0.1 as the probes dial)."""
    import asyncio
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed, and the script needs it")
    done = subprocess.run(["bash", str(DEPLOY / "k8s" / "make-tls-secret.sh"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    secret = yaml.safe_load((tmp_path / "secret.yaml").read_text())
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}

    from pdmesh.client import Security
    from pdmesh.rpc.health import health_status
    from pdmesh.rpc.server import create_server, set_serving
    from pdmesh.rpc.tls import TLSFiles, configure

    files = {n: str(tmp_path / n) for n in ("tls.crt", "tls.key", "ca.crt")}

    async def serve_and_probe() -> str:
        server, port, health = create_server("127.0.0.1:0", [], tls=TLSFiles.load(
            files["tls.crt"], files["tls.key"], files["ca.crt"]))
        await server.start()
        await set_serving(health, [], True)
        try:
            creds = Security(files["ca.crt"], files["tls.crt"], files["tls.key"]).credentials()
            return await asyncio.to_thread(health_status, f"127.0.0.1:{port}", creds)
        finally:
            await server.stop(0)
            configure(None)  # create_server set this process's TLS: other tests dial plaintext

    assert asyncio.run(serve_and_probe()) == "SERVING"
