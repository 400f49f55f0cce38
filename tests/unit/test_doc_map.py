"""The docs say only what the code does (tests/support/doc_map.py holds the rules):

- ARCHITECTURE.md's layer line is pyproject.toml's import-linter contract, and its import
  graph is the code's (grimp's, the graph import-linter checks); a stale block fails with
  the diff, and ``make docs-map`` rewrites it;
- every repository path in backticks in README.md, ARCHITECTURE.md and docs/*.md exists,
  and every relative link of theirs reaches a file;
- every ``rmqha.x.y`` a page or a module's docstring names imports (and its attributes
  resolve).

Each rule has its negative control: a doc with a bogus edge, path or module is refused.
"""
from __future__ import annotations

from pathlib import Path

import doc_map
import pytest

ROOT = doc_map.ROOT


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return doc_map.build_graph()


@pytest.fixture(scope="module")
def repo() -> doc_map.Repo:
    return doc_map.Repo.here()


def test_architecture_blocks_are_generated_from_the_code(graph) -> None:  # type: ignore[no-untyped-def]
    text = doc_map.ARCHITECTURE.read_text(encoding="utf-8")
    diffs = doc_map.block_diffs(text, doc_map.generated_blocks(graph))
    assert not diffs, "ARCHITECTURE.md is stale (run `make docs-map`):\n" + "\n".join(diffs)


def test_a_bogus_edge_in_the_doc_is_refused_with_its_diff(graph) -> None:  # type: ignore[no-untyped-def]
    blocks = doc_map.generated_blocks(graph)
    text = doc_map.ARCHITECTURE.read_text(encoding="utf-8")
    bogus = text.replace("messaging  -> ", "messaging  -> client, ", 1)
    assert bogus != text
    diffs = doc_map.block_diffs(bogus, blocks)
    assert len(diffs) == 1 and "-messaging  -> client, " in diffs[0], diffs
    fixed = doc_map.rewrite(bogus, blocks)
    assert doc_map.block_diffs(fixed, blocks) == [] and fixed == text


def test_a_new_import_in_the_code_changes_the_generated_graph(graph) -> None:  # type: ignore[no-untyped-def]
    before = doc_map.package_edges(graph)
    assert "client" not in before["store"]
    graph.add_import(importer="rmqha.store.commitlog", imported="rmqha.client.producer")
    try:
        after = doc_map.package_edges(graph)
    finally:
        graph.remove_import(importer="rmqha.store.commitlog", imported="rmqha.client.producer")
    assert after["store"] == before["store"] | {"client"}
    text = doc_map.ARCHITECTURE.read_text(encoding="utf-8")
    blocks = {**doc_map.generated_blocks(graph), "import-graph": doc_map.graph_block(after)}
    assert any("+store " in d and "client" in d for d in doc_map.block_diffs(text, blocks))


def test_the_layer_line_is_the_contract(tmp_path: Path) -> None:
    line = doc_map.layers_block()
    assert line.startswith("```\ncli > demo > ") and line.endswith(" > errors\n```")
    changed = tmp_path / "pyproject.toml"
    changed.write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8")
                       .replace('"messaging | ha | controller"', '"messaging | controller | ha"'))
    assert "messaging | controller | ha" in doc_map.layers_block(changed)


@pytest.mark.parametrize("page", doc_map.doc_pages(), ids=lambda p: p.name)
def test_every_repository_path_a_page_names_exists(page: Path, repo: doc_map.Repo) -> None:
    missing = doc_map.missing_paths(page.read_text(encoding="utf-8"), repo)
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_path_rule_is_strict_for_repository_paths(repo: doc_map.Repo) -> None:
    bogus = ("See `tests/test_commitlog_disk.py`, `rmqha/ha/service.py`, `controller/raft_old.py`, "
             "`deploy/conf/*.yml`, `no_such_module.py` and `docs/`.")
    assert doc_map.missing_paths(bogus, repo) == sorted(
        ["tests/test_commitlog_disk.py", "rmqha/ha/service.py", "controller/raft_old.py",
         "deploy/conf/*.yml", "no_such_module.py"])
    fine = ("`tests/unit/test_commitlog_disk.py`, `controller/raft.py`, `net/`, `deploy/conf/*.toml`, "
            "`route.py`, `deploy/.env` (generated, in .gitignore)")
    assert doc_map.missing_paths(fine, repo) == []


def test_things_that_are_not_repository_paths_pass(repo: doc_map.Repo) -> None:
    not_paths = ("`store_dir/confirmOffset`, `consumequeue/checkpoint`, `rmqha:broker/C/G/N`, "
                 "`/etc/rmqha`, `~/store`, `hdfs://`, `acl_file`, `plain_acl.yml`, `a = b/c`")
    assert doc_map.missing_paths(not_paths, repo) == []
    fenced = "```\ntests/test_nothing.py\n```\n"
    assert doc_map.missing_paths(fenced, repo) == []


@pytest.mark.parametrize("page", doc_map.doc_pages(), ids=lambda p: p.name)
def test_every_link_of_a_page_reaches_a_file(page: Path) -> None:
    missing = doc_map.missing_links(page.read_text(encoding="utf-8"), page.parent)
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_the_link_rule_fires() -> None:
    text = "[a](benchmarks.md#x), [b](../README.md), [c](gone.md), [d](https://example.org/x.md)"
    assert doc_map.missing_links(text, ROOT / "docs") == ["gone.md"]


@pytest.mark.parametrize("page", doc_map.doc_pages(), ids=lambda p: p.name)
def test_every_module_a_page_names_imports(page: Path) -> None:
    names = doc_map.module_names(page.read_text(encoding="utf-8"))
    wrong = [n for n in names if not doc_map.resolves(n)]
    assert not wrong, f"{page.relative_to(ROOT)} names modules that do not import: {wrong}"


def test_every_module_a_docstring_names_imports() -> None:
    bad = doc_map.unresolved_in_docstrings()
    assert not bad, f"docstrings name modules that do not import: {bad}"


def test_the_module_rule_fires(tmp_path: Path) -> None:
    assert doc_map.resolves("rmqha.ha.sync_service")
    assert doc_map.resolves("rmqha.protocol.command.FrameDecoder")
    assert not doc_map.resolves("rmqha.ha.service")
    assert not doc_map.resolves("rmqha.protocol.command.NoSuchThing")
    assert doc_map.resolves("rmqha.net.connection.Connection.peer_identity")  # set in __init__
    assert not doc_map.resolves("rmqha.net.connection.Connection.peer_nothing")
    pkg = tmp_path / "rmqha"
    pkg.mkdir()
    (pkg / "bad.py").write_text('"""Its work is :mod:`rmqha.ha.service`\'s."""\n', encoding="utf-8")
    assert doc_map.unresolved_in_docstrings(pkg) == {"rmqha/bad.py": ["rmqha.ha.service"]}
