"""The package's shape: no import cycle among rmqha's modules, no module over 800 lines.

A cycle means neither module can be read (or changed) without the other; import-linter's
layers hold between packages only, so a cycle inside one package passes them. Cycles are
found on grimp's graph (the one import-linter checks, ``TYPE_CHECKING`` imports included:
a type named across a cycle still ties the two modules together).

800 lines is about what one concept fills here; a longer module holds several. The modules
longer than that today are listed with their length as a ceiling: each may shrink (and
must leave the list once under 800) but not grow. Splitting them is open work.
"""
from __future__ import annotations

from pathlib import Path

import doc_map
import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 800

#: Modules over MAX_LINES today, with their length as a ceiling.
LONG_TODAY: dict[str, int] = {
    "rmqha/_core/records.pyx": 1234,
    "rmqha/_core/frames.pyx": 1173,
    "rmqha/store/commitlog.py": 1026,
    # The Dispatcher and the lane types moved to net/dispatcher.py (handlers typed on
    # RequestPeer/LanePeer, not Connection); what is left is frames, writes and pending answers.
    "rmqha/net/connection.py": 866,
    "rmqha/_core/frames_py.py": 846,
    "rmqha/_core/send_frames.pyx": 859,
}


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    cycles.append(sorted(part))
    return cycles


def module_edges(graph) -> dict[str, set[str]]:  # type: ignore[no-untyped-def]
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return doc_map.build_graph()


def test_no_import_cycle_among_rmqha_modules(graph) -> None:  # type: ignore[no-untyped-def]
    cycles = import_cycles(module_edges(graph))
    assert not cycles, f"import cycles among rmqha's modules: {cycles}"


def test_a_cycle_is_found(graph) -> None:  # type: ignore[no-untyped-def]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges = module_edges(graph)
    edges["rmqha.messaging.topic_admin"].add("rmqha.messaging.state_replication")
    assert ["rmqha.messaging.state_replication", "rmqha.messaging.topic_admin"] in import_cycles(edges)


def _lengths() -> dict[str, int]:
    files = [*(ROOT / "rmqha").rglob("*.py"), *(ROOT / "rmqha").rglob("*.pyx")]
    return {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in files}


def long_modules(lengths: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """What breaks the rule: a new long module, a listed one grown, or one listed needlessly."""
    problems = []
    for path, n in sorted(lengths.items()):
        if n > MAX_LINES and path not in allowed:
            problems.append(f"{path}: {n} lines (over {MAX_LINES}: split it by job)")
        elif path in allowed and n > allowed[path]:
            problems.append(f"{path}: {n} lines, grown past its {allowed[path]} (split it, do not grow it)")
        elif path in allowed and n <= MAX_LINES:
            problems.append(f"{path}: {n} lines, under {MAX_LINES} now: take it off LONG_TODAY")
    problems += [f"{path}: listed in LONG_TODAY but gone" for path in allowed if path not in lengths]
    return problems


def test_no_module_over_800_lines_but_todays_which_do_not_grow() -> None:
    problems = long_modules(_lengths(), LONG_TODAY)
    assert not problems, "\n".join(problems)


def test_the_length_rule_fires() -> None:
    allowed = {"rmqha/big.py": 900}
    assert long_modules({"rmqha/new.py": 801, "rmqha/big.py": 900}, allowed) == [
        "rmqha/new.py: 801 lines (over 800: split it by job)"]
    assert "grown past" in long_modules({"rmqha/big.py": 901}, allowed)[0]
    assert "take it off" in long_modules({"rmqha/big.py": 700}, allowed)[0]
    assert long_modules({"rmqha/ok.py": 800}, {}) == []
