"""docs/configuration.md is ``rmqha config-keys --markdown``: every key of the three
processes with its default and meaning, so the page cannot drift from the code; and every
key has a meaning (the ``#:`` comment above its field), so the page and the command both
say what each key does."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rmqha.cli.config_keys import _config_classes, markdown_tables
from rmqha.config import describe_keys

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
BEGIN = "<!-- generated: rmqha config-keys --markdown -->\n"
END = "<!-- end: rmqha config-keys --markdown -->"


def _tables(page: str) -> str:
    assert page.count(BEGIN) == 1 and page.count(END) == 1, f"{PAGE} lost its markers"
    return page.split(BEGIN)[1].split(END)[0]


def test_the_configuration_page_is_the_commands_output() -> None:
    have, want = _tables(PAGE.read_text(encoding="utf-8")), markdown_tables()
    assert have == want, ("docs/configuration.md differs from `rmqha config-keys --markdown`; "
                          "run `make docs-map`")


def test_a_page_missing_a_key_differs_from_the_output() -> None:
    want = markdown_tables()
    line = next(ln for ln in want.splitlines() if ln.startswith("| `segment_bytes`"))
    assert want.replace(line + "\n", "") != want


@pytest.mark.parametrize("process", ["controller", "namesrv", "broker"])
def test_every_key_is_on_the_page(process: str) -> None:
    page = PAGE.read_text(encoding="utf-8")
    missing = [d.key for d in describe_keys(_config_classes()[process]) if f"| `{d.key}` |" not in page]
    assert not missing, f"docs/configuration.md lacks {process} keys {missing}"


def _undocumented(cls: type) -> list[str]:
    return [d.key for d in describe_keys(cls) if not d.doc.strip()]


@pytest.mark.parametrize("process", ["controller", "namesrv", "broker"])
def test_every_key_has_a_meaning(process: str) -> None:
    missing = _undocumented(_config_classes()[process])
    assert not missing, (f"{process} keys without a meaning: {missing}; write a `#:` comment above "
                         "each field (it is what `rmqha config-keys` and docs/configuration.md print)")


@dataclasses.dataclass
class _Sample:
    #: Documented.
    said: int = 1
    unsaid: int = 2


def test_a_key_without_a_meaning_is_named() -> None:
    assert _undocumented(_Sample) == ["unsaid"]
