"""spark_bench in the wheel, without building one: the issue's "spark_bench missing from
the wheel" as a regression test.

A wheel is what setuptools' ``build_py`` lays out (plus the compiled twins, which take
minutes to build: ``make wheel-check`` builds and installs a real wheel in CI). Here the
project's own pyproject.toml configures a distribution and ``build_py`` runs into a
temporary directory, so a package or data file left out of the packaging config fails
in a second, naming what is missing.
"""
from __future__ import annotations

import os
import tomllib

import needs
from spark_support import PROJECT_ROOT

setuptools_dist = needs.module("setuptools.dist", "setuptools (the venv's build tool)", module_level=True)
pyprojecttoml = needs.module("setuptools.config.pyprojecttoml", "setuptools (the venv's build tool)", module_level=True)


def test_build_py_lays_out_every_spark_bench_module_and_its_log_config(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(PROJECT_ROOT)  # the packaging config's paths are the project's
    dist = setuptools_dist.Distribution()
    pyprojecttoml.apply_configuration(dist, os.path.join(PROJECT_ROOT, "pyproject.toml"))
    dist.script_name = "setup.py"  # read by build_py, never run here
    # build_py asks egg_info which data files the sources hold: keep its notes out of the
    # project tree.
    dist.get_command_obj("egg_info").egg_base = str(tmp_path)
    build_py = dist.get_command_obj("build_py")
    build_py.build_lib = str(tmp_path / "wheel")
    dist.run_command("build_py")
    source = os.path.join(PROJECT_ROOT, "spark_bench")
    expected = {n for n in os.listdir(source) if n.endswith(".py")} | {"log4j2.properties"}
    laid_out = set(os.listdir(tmp_path / "wheel" / "spark_bench"))
    assert expected <= laid_out, f"missing from the wheel: {sorted(expected - laid_out)}"


def test_the_console_entry_point_and_the_spark_extra() -> None:
    with open(os.path.join(PROJECT_ROOT, "pyproject.toml"), "rb") as fh:
        project = tomllib.load(fh)["project"]
    assert project["scripts"]["rmqha-trends"] == "spark_bench.cli:main"
    from spark_bench.cli import main
    assert callable(main)
    extra = " ".join(project["optional-dependencies"]["spark"])
    for needed in ("pyspark", "pandas", "pyarrow", "plotly"):
        assert needed in extra
