"""README.md must stay true: every command is documented, its examples run, and the pages it
sends readers to exist (the benchmark tables live in docs/benchmarks.md, which `make
bench-peers` rewrites; the configuration keys in docs/configuration.md, checked by
tests/unit/test_config_keys_doc.py)."""
from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

from rmqha.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_command_is_in_readme() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # Aliases map to the same parser; document the primary (kebab-case) names.
    primary = {name for name, p in sub.choices.items() if p.prog.endswith(" " + name)}
    missing = sorted(name for name in primary if f"`{name}" not in README)
    assert not missing, f"README.md does not mention the commands {missing}"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_storage_example_runs(tmp_path: Path) -> None:
    block = next(b for b in _python_blocks() if "CommitLog(" in b)
    code = block.replace('"/var/lib/app/commitlog"', repr(str(tmp_path / "log")))
    code = code.replace("segment_bytes=1 << 30", "segment_bytes=1 << 20")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - our own README
    assert scope["message"].body == b"payload"
    assert scope["message"].properties["KEYS"] == "42"


def test_readme_client_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cluster import Cluster

    block = next(b for b in _python_blocks() if "BlockingProducer(" in b)
    with Cluster(tmp_path) as cluster:
        cluster.start_controllers(1)
        namesrv = cluster.start_namesrv()
        cluster.start_group("broker-a", 1)
        code = block.replace('"127.0.0.1:9876"', repr(namesrv.address))
        scope: dict = {}
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - our own README
    assert scope["result"].ok
    out = capsys.readouterr().out
    assert "SEND_OK" in out
    assert "b'order 42'" in out, out


def test_readme_links_point_at_files_of_the_repository() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert {"ARCHITECTURE.md", "docs/benchmarks.md", "docs/configuration.md", "docs/guarantees.md"} <= set(local)
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_bench_peers_writes_its_table_into_the_benchmarks_doc(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "benches" / "bench_peers.py")
    assert spec is not None and spec.loader is not None
    bench_peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_peers)
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert doc.count(bench_peers.BEGIN) == 1 and doc.count(bench_peers.END) == 1
    assert bench_peers.BEGIN not in README, "the peers table moved to docs/benchmarks.md"
    copy = tmp_path / "benchmarks.md"
    copy.write_text(doc, encoding="utf-8")
    bench_peers.write_table(copy, "| workload | new |")
    written = copy.read_text(encoding="utf-8")
    head, rest = doc.split(bench_peers.BEGIN)
    tail = rest.split(bench_peers.END)[1]
    assert written == f"{head}{bench_peers.BEGIN}\n| workload | new |\n{bench_peers.END}{tail}"
