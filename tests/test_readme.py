"""README.md must stay true: every configuration key and every command is documented."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rmqha.cli import build_parser
from rmqha.cli.config_keys import _config_classes
from rmqha.config import describe_keys

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("process", ["controller", "namesrv", "broker"])
def test_every_config_key_is_in_readme(process: str) -> None:
    missing = [d.key for d in describe_keys(_config_classes()[process]) if f"`{d.key}`" not in README]
    assert not missing, f"README.md lacks {process} keys {missing}: run `rmqha config-keys --markdown`"


def test_every_command_is_in_readme() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # Aliases map to the same parser; document the primary (kebab-case) names.
    primary = {name for name, p in sub.choices.items() if p.prog.endswith(" " + name)}
    missing = sorted(name for name in primary if f"`{name}" not in README)
    assert not missing, f"README.md does not mention the commands {missing}"
