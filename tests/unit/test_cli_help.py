"""Every command and flag of ``pdmesh`` says what it does and what its default is."""

from __future__ import annotations

import argparse

import pytest
import torch

from pdmesh.attention.select import build_backend
from pdmesh.cli import build_parser
from pdmesh.errors import InvalidRequestError


def _commands(parser: argparse.ArgumentParser, path: str = "pdmesh") -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _commands(sub, f"{path} {name}")
    return out


def test_every_command_and_flag_has_help_with_its_default() -> None:
    missing = []
    for path, parser in _commands(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{path} {c.dest}" for c in action._choices_actions if not c.help]
                continue
            if isinstance(action, argparse._HelpAction) or not action.option_strings:
                continue
            flag = action.option_strings[-1]
            if not action.help:
                missing.append(f"{path} {flag}: no help")
            elif action.nargs != 0 and action.dest != "config" and "default" not in action.help \
                    and "required" not in action.help:
                missing.append(f"{path} {flag}: no default in its help")
    assert missing == []


def test_an_unknown_attention_backend_is_an_error_that_lists_the_choices() -> None:
    with pytest.raises(InvalidRequestError,
                       match=r"'flashattn' is not available; choose one of \['cpu', 'flashinfer', 'torch'\]"):
        build_backend("flashattn", "cpu", torch.float32, 64)


def test_pdmesh_help_lists_every_command_and_each_ends_with_examples_that_parse(
        capsys: pytest.CaptureFixture[str]) -> None:
    import shlex

    from pdmesh.cli.examples import EXAMPLES, leaf_commands

    parser = build_parser()
    top = parser.format_help()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert all(f"    {name}" in top for name in subs.choices), top
    leaves = leaf_commands(parser)
    assert set(leaves) == set(EXAMPLES)
    for path, command in leaves.items():
        help_text = command.format_help()
        assert help_text.rstrip().splitlines()[-len(EXAMPLES[path]) - 1] == "examples:", path
        for line in EXAMPLES[path]:
            words = shlex.split(line)
            assert words[0] == "pdmesh" and " ".join(words[1:1 + len(path.split())]) == path, line
            parser.parse_args(words[1:])  # every flag of the example exists and takes its value
