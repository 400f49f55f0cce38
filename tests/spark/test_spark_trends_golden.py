"""The trend job gives the outputs it gave before the issue-41 speed work: summary, change
points, every series point, the gate's lines and the report's text, on one fixed synthetic
history (tests/spark/golden_trends.py says how the golden files were made and compared).

A rerun with nothing new must give them again (from the reused tables), and a negative
control shows the comparison can fail: the same tables judged at another threshold (the
pandas-only ``report`` command) give another gate verdict and report."""
from __future__ import annotations

import difflib
import io
import os
from contextlib import redirect_stderr, redirect_stdout

import pytest
from spark_support import SPARK_OK, SPARK_TEST_MARKS, spark  # noqa: F401 - fixture

if SPARK_OK:
    import golden_trends

    from spark_bench.cli import main

pytestmark = [*SPARK_TEST_MARKS, pytest.mark.timeout(900)]

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "trends")


def _golden() -> dict[str, str]:
    return {name: golden_trends.read_text(os.path.join(GOLDEN, name)) for name in golden_trends.FILES}


def _differences(got: dict[str, str], want: dict[str, str]) -> list[str]:
    out = []
    for name in golden_trends.FILES:
        if got[name] != want[name]:
            diff = difflib.unified_diff(want[name].splitlines(), got[name].splitlines(),
                                        f"golden/{name}", f"now/{name}", n=0, lineterm="")
            out.append("\n".join(list(diff)[:20]))
    return out


@pytest.fixture(scope="module")
def first(spark, tmp_path_factory):  # noqa: ANN001, ANN201, F811
    root = str(tmp_path_factory.mktemp("golden"))
    code, texts, _ = golden_trends.run(root, spark)
    return {"root": root, "code": code, "texts": texts}


def test_outputs_match_the_golden_files(first) -> None:  # noqa: ANN001
    assert first["code"] == 1  # the 20% and 12% open regressions fail the gate
    assert _differences(first["texts"], _golden()) == []


def test_a_rerun_with_nothing_new_gives_the_same_outputs(first, spark) -> None:  # noqa: ANN001, F811
    code, texts, stdout = golden_trends.run(first["root"], spark)
    assert code == 1
    assert "unchanged since the last run" in stdout
    assert _differences(texts, _golden()) == []


def test_negative_control_another_verdict_differs(first) -> None:  # noqa: ANN001
    out = os.path.join(first["root"], "out")
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = main(["report", "--out", out, "--fail-on-regression", "--threshold", "25"])
    assert code == 0
    texts = golden_trends.outputs(out, err.getvalue())
    changed = _differences(texts, _golden())
    assert [c.split("\n", 1)[0] for c in changed] == ["--- golden/gate.txt", "--- golden/report.txt"]
