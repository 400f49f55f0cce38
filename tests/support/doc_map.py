"""The checkable parts of the docs: ARCHITECTURE.md's layer line and import graph, generated
from the code, and the rules that every repository path and every ``rmqha.x.y`` module a
page or a docstring names exists.

Why generated: the hand-kept graph drifted six ways in a few weeks (an edge the ``servers``
contract forbids, a package drawn without one it imports). The layers come from
``pyproject.toml``'s import-linter contract (the rule), the graph from grimp, the import
graph import-linter checks (the fact), so neither can say what the code does not.

``python tests/support/doc_map.py`` prints the two blocks; ``--write`` rewrites them in
ARCHITECTURE.md and docs/configuration.md's tables (``make docs-map``); ``--check`` exits 1
with a diff when the blocks differ.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
PACKAGE = "rmqha"

#: Markers around each generated block; what lies between them is rewritten whole.
BLOCKS = ("layers", "import-graph")


def _begin(name: str) -> str:
    return f"<!-- generated: {name} (make docs-map rewrites it) -->"


def _end(name: str) -> str:
    return f"<!-- end: {name} -->"


# -- the layer line -------------------------------------------------------------------------


def layers_block(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """import-linter's ``layers`` contract as one line, top down (``>`` between layers)."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    lines = [layers[0]]
    for layer in layers[1:]:  # wrapped at 90 columns, a continuation line starting with ``>``
        if len(lines[-1]) + len(layer) + 3 > 90:
            lines.append(f"    > {layer}")
        else:
            lines[-1] += f" > {layer}"
    return "```\n" + "\n".join(lines) + "\n```"


# -- the import graph -----------------------------------------------------------------------


def _top(module: str) -> str:
    """``rmqha.store.commitlog`` -> ``store``; the package's own ``__init__`` -> ``rmqha``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_edges(graph: Any) -> dict[str, set[str]]:
    """Direct imports between rmqha's top-level packages/modules, from a grimp graph."""
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if _top(module) != _top(imported):
                edges.setdefault(_top(module), set()).add(_top(imported))
    return edges


def build_graph() -> Any:
    import grimp  # the dev extra's, with import-linter: the same graph its contracts see

    return grimp.build_graph(PACKAGE, cache_dir=None)


def graph_block(edges: dict[str, set[str]]) -> str:
    width = max(len(a) for a in edges)
    lines = [f"{a:{width}} -> {', '.join(sorted(edges[a]))}" for a in sorted(edges)]
    return "```\n" + "\n".join(lines) + "\n```"


def generated_blocks(graph: Any | None = None) -> dict[str, str]:
    return {"layers": layers_block(), "import-graph": graph_block(package_edges(graph or build_graph()))}


def _span(text: str, name: str) -> tuple[int, int]:
    begin, end = _begin(name), _end(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"ARCHITECTURE.md must hold exactly one {begin!r} ... {end!r}")
    start = text.index(begin) + len(begin)
    return start, text.index(end, start)


def block_diffs(text: str, blocks: dict[str, str]) -> list[str]:
    """A unified diff per generated block that ``text`` holds differently; empty when true."""
    diffs = []
    for name, want in blocks.items():
        start, stop = _span(text, name)
        have = text[start:stop].strip("\n")
        if have != want:
            diff = difflib.unified_diff(have.splitlines(), want.splitlines(),
                                        f"ARCHITECTURE.md ({name})", "generated from the code", lineterm="")
            diffs.append("\n".join(diff))
    return diffs


def rewrite(text: str, blocks: dict[str, str]) -> str:
    for name, want in blocks.items():
        start, stop = _span(text, name)
        text = f"{text[:start]}\n{want}\n{text[stop:]}"
    return text


# -- paths in backticks ---------------------------------------------------------------------


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


@dataclass(frozen=True)
class Repo:
    """What a path can be checked against: the tracked files, plus the worktree."""

    root: Path
    tracked: frozenset[str]

    @classmethod
    def here(cls) -> Repo:
        return cls(ROOT, frozenset(_tracked()))

    @property
    def top_entries(self) -> set[str]:
        return {p.split("/")[0] for p in self.tracked}

    @property
    def package_entries(self) -> set[str]:
        return {p.split("/")[1] for p in self.tracked if p.startswith(PACKAGE + "/") and p.count("/") >= 1}

    @property
    def basenames(self) -> set[str]:
        return {p.rsplit("/", 1)[-1] for p in self.tracked}

    def exists(self, path: str) -> bool:
        """Tracked, present, or a file the project generates (named in .gitignore)."""
        clean = path.rstrip("/")
        if any(ch in clean for ch in "*?["):
            return any(fnmatch.fnmatch(p, clean) for p in self.tracked)
        if clean in self.tracked or any(p.startswith(clean + "/") for p in self.tracked):
            return True
        if (self.root / clean).exists():
            return True
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", clean], cwd=self.root)
        return ignored.returncode == 0


#: Inline code that is not a repository path however it looks: URLs, identities
#: (``rmqha:broker/...``), assignments, placeholders, absolute and home paths (the
#: machine's, not the repository's).
_NOT_A_PATH = re.compile(r"://|[:=<>\s]|^[/~]|^\.\.?/")
_SOURCE_FILE = re.compile(r"^[\w.-]+\.(?:py|pyx|pyi|md)$")


def inline_code(text: str) -> list[str]:
    """Every `span` of a markdown text outside fenced blocks."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", prose)


def repo_path(token: str, repo: Repo) -> str | None:
    """The repository path ``token`` names, or None when it does not look like one.

    Strict for anything that looks like a path of this repository: a token with ``/``
    whose first part is a top-level entry (``tests/...``, ``deploy/...``) names that
    path; one whose first part is a part of the package (``controller/raft.py``,
    ``net/``) names it under ``rmqha/``. Other slashed tokens are runtime paths
    (``store_dir/confirmOffset``, ``consumequeue/checkpoint``). A bare source file name
    (``route.py``) must be some tracked file's name.
    """
    if _NOT_A_PATH.search(token):
        return None
    if "/" in token:
        first = token.split("/")[0]
        if first in repo.top_entries:
            return token
        if first in repo.package_entries:
            return f"{PACKAGE}/{token}"
        return None
    if _SOURCE_FILE.match(token) and "*" not in token:
        return token
    return None


def missing_paths(text: str, repo: Repo) -> list[str]:
    missing = []
    for token in inline_code(text):
        path = repo_path(token, repo)
        if path is None:
            continue
        found = repo.exists(path) if "/" in path else path in repo.basenames
        if not found:
            missing.append(token)
    return sorted(set(missing))


def missing_links(text: str, page_dir: Path) -> list[str]:
    """Relative markdown links of a page (``[x](docs/y.md#z)``) whose file does not exist."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    return sorted({link for link in links if "://" not in link and not (page_dir / link).exists()})


# -- module names ---------------------------------------------------------------------------

_MODULE_NAME = re.compile(r"(?<![\w/.-])rmqha(?:\.\w+)+")  # not a file name: deploy/kubernetes/rmqha.yaml


def resolves(name: str) -> bool:
    """``rmqha.a.b.C.d`` names something: its longest module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if not _is_module(module):
            continue
        try:
            obj: Any = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # The proxy's modules need the proxy extra (grpc), absent from the main venv:
            # their names are then checked in their source.
            if exc.name and not exc.name.startswith(PACKAGE):
                return _defined_in_source(module, parts[cut:])
            raise
        return all(_has(obj, attr) for obj, attr in _walk(obj, parts[cut:]))
    return False


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except ModuleNotFoundError:  # a parent that is no package
        return False


def _walk(obj: Any, attrs: list[str]) -> list[tuple[Any, str]]:
    steps = []
    for attr in attrs:
        steps.append((obj, attr))
        obj = getattr(obj, attr, None)
    return steps


def _has(obj: Any, attr: str) -> bool:
    if obj is None:
        return False
    if hasattr(obj, attr):
        return True
    if inspect.isclass(obj):  # an instance attribute, set in a method
        return bool(re.search(rf"self\.{attr}\b\s*(:[^=\n]+)?=", inspect.getsource(obj)))
    if inspect.ismodule(obj):  # a submodule its package does not import
        return _is_module(f"{obj.__name__}.{attr}")
    return False


def _defined_in_source(module: str, attrs: list[str]) -> bool:
    spec = importlib.util.find_spec(module)
    if not attrs:
        return True
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))  # type: ignore[union-attr, arg-type]
    top = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    top |= {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    return attrs[0] in top


def module_names(text: str) -> list[str]:
    return sorted({m.rstrip(".") for m in _MODULE_NAME.findall(text)})


def docstrings(path: Path) -> list[str]:
    """The module's, each class's and each function's docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [doc for node in ast.walk(tree) if isinstance(node, kinds) and (doc := ast.get_docstring(node))]


def unresolved_in_docstrings(root: Path = ROOT / PACKAGE) -> dict[str, list[str]]:
    """Per module file, the ``rmqha.x.y`` names its docstrings hold that name nothing."""
    bad: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        names = {n for doc in docstrings(path) for n in module_names(doc)}
        wrong = sorted(n for n in names if not resolves(n))
        if wrong:
            bad[str(path.relative_to(root.parent))] = wrong
    return bad


# -- docs/configuration.md ----------------------------------------------------------------

CONFIGURATION = ROOT / "docs" / "configuration.md"
CONFIG_BEGIN = "<!-- generated: rmqha config-keys --markdown -->\n"
CONFIG_END = "<!-- end: rmqha config-keys --markdown -->"


def configuration_page(page: str) -> str:
    """The page with its tables replaced by ``rmqha config-keys --markdown``'s."""
    from rmqha.cli.config_keys import markdown_tables

    head, rest = page.split(CONFIG_BEGIN)
    return head + CONFIG_BEGIN + markdown_tables() + CONFIG_END + rest.split(CONFIG_END)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the blocks in ARCHITECTURE.md")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when they differ")
    args = parser.parse_args(argv)
    blocks = generated_blocks()
    text = ARCHITECTURE.read_text(encoding="utf-8")
    if args.write:
        ARCHITECTURE.write_text(rewrite(text, blocks), encoding="utf-8")
        CONFIGURATION.write_text(configuration_page(CONFIGURATION.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    if args.check:
        diffs = block_diffs(text, blocks)
        print("\n".join(diffs) or "ARCHITECTURE.md's generated blocks are current")
        return 1 if diffs else 0
    print("\n\n".join(blocks.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
