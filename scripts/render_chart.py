"""Render pdmesh's Helm chart (deploy/helm/pdmesh) without helm, into deploy/k8s/.

``helm template deploy/helm/pdmesh`` is the way to render it where helm is installed; our
machines have no helm, so the chart's templates keep to a small subset of Go templates
that this script renders exactly as helm does, and refuses anything outside it:

- ``{{ .Values.a.b }}`` and ``{{ .Values.a.b | quote }}``;
- ``{{- if .Values.a }}`` / ``{{- if not .Values.a }}``, ``{{- else }}``, ``{{- end }}``;
- ``{{-`` trims the whitespace before it (newline included), as helm does.

``python scripts/render_chart.py`` rewrites deploy/k8s/pdmesh.yaml (the chart's defaults)
and deploy/k8s/pdmesh-plaintext.yaml (``tls.enabled=false``); ``--check`` fails when they
differ from the chart (``tests/unit/test_deploy.py`` runs it).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "pdmesh"
RENDERINGS = {"pdmesh.yaml": {}, "pdmesh-plaintext.yaml": {"tls": {"enabled": False}}}
"""deploy/k8s/NAME: the chart rendered with these values over values.yaml."""
ACTION = re.compile(r"(\s*)\{\{(-?)\s*(.*?)\s*(-?)\}\}")
VALUE = re.compile(r"^\.Values((?:\.\w+)+)(\s*\|\s*quote)?$")
IF = re.compile(r"^if (not )?\.Values((?:\.\w+)+)$")


class TemplateError(ValueError):
    """A template uses Go-template syntax outside the subset rendered here."""


def _lookup(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for key in path.strip(".").split("."):
        if not isinstance(node, dict) or key not in node:
            raise TemplateError(f"no value .Values{path}")
        node = node[key]
    return node


def _text(value: Any, quote: bool) -> str:
    if quote:
        return json.dumps(str(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render(template: str, values: dict[str, Any]) -> str:
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch emits, the enclosing one emits)
    pos = 0
    for m in ACTION.finditer(template):
        leading, trim_left, body, trim_right = m.groups()
        if trim_right:
            raise TemplateError(f"'-}}}}' is outside the subset: {m.group(0).strip()}")
        emitting = all(e for e, _ in stack)
        if emitting:
            out.append(template[pos:m.start()] + ("" if trim_left else leading))
        pos = m.end()
        if (v := VALUE.match(body)) is not None:
            if emitting:
                out.append(_text(_lookup(values, v.group(1)), bool(v.group(2))))
        elif (c := IF.match(body)) is not None:
            truth = bool(_lookup(values, c.group(2))) != bool(c.group(1))
            stack.append((truth, emitting))
        elif body == "else":
            if not stack:
                raise TemplateError("else without if")
            truth, outer = stack.pop()
            stack.append((not truth, outer))
        elif body == "end":
            if not stack:
                raise TemplateError("end without if")
            stack.pop()
        else:
            raise TemplateError(f"{{{{ {body} }}}} is outside the subset this renderer implements")
    if stack:
        raise TemplateError("an if has no end")
    out.append(template[pos:])
    return "".join(out)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in over.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def render_chart(overrides: dict[str, Any]) -> str:
    """Every template of the chart, in file order, as one multi-document manifest."""
    values = _merge(yaml.safe_load((CHART / "values.yaml").read_text()), overrides)
    header = ("# Rendered from deploy/helm/pdmesh by scripts/render_chart.py (do not edit: edit the chart)."
              f"\n# Values over the chart's defaults: {json.dumps(overrides) if overrides else 'none'}.\n")
    docs = [render(p.read_text(), values).strip() for p in sorted((CHART / "templates").glob("*.yaml"))]
    return header + "\n---\n".join(d for d in docs if d) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if deploy/k8s differs from the chart")
    args = parser.parse_args(argv)
    stale = []
    for name, overrides in RENDERINGS.items():
        target, text = ROOT / "deploy" / "k8s" / name, render_chart(overrides)
        list(yaml.safe_load_all(text))  # the rendering must be YAML
        if args.check:
            if not target.is_file() or target.read_text() != text:
                stale.append(name)
        else:
            target.write_text(text)
    if stale:
        print(f"deploy/k8s/{', '.join(stale)} differ from the chart: run python scripts/render_chart.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
