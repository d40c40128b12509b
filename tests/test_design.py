"""DESIGN.md's import tree, checked against the code so that it cannot drift.

The tree is DESIGN.md's first fenced block: a line for each module of ours, `importer.py ──> imported.py, ...` (a long
list goes on over the next lines; `──> (none)` where it imports none of ours; notes in parentheses), every arrow
pointing to a line further down. The code's imports are read with ast, not run, so an import inside a function counts
too. Our modules are the .py files at the repository's root and in its packages (folders with __init__.py): `import
parallel.zero`, `from parallel import zero` and, inside the package, `from .zero import X` all name parallel/zero.py."""

import ast
import importlib.util
import re
from graphlib import CycleError, TopologicalSorter

import pytest

from conftest import ROOT

NOT_MODULES = {"tests", "notebooks", "exercises", "bench", "examples"}  # folders of scripts, never imported


def code_graph():
    """{file: the files of ours it imports}, each named by its path from the root: train.py, parallel/zero.py."""
    files = [*ROOT.glob("*.py")]
    for init in ROOT.glob("*/__init__.py"):
        if init.parent.name not in NOT_MODULES:
            files += init.parent.rglob("*.py")
    paths = [file.relative_to(ROOT).as_posix() for file in files]
    path_of = {path.removesuffix(".py").removesuffix("/__init__").replace("/", "."): path for path in paths}
    graph = {}
    for module, path in path_of.items():  # module: parallel.zero, path: parallel/zero.py
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse((ROOT / path).read_text(), path)):
            if isinstance(node, ast.Import):  # import parallel.zero
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):  # from parallel import zero; from .zero import X
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                imported |= {
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in path_of else base for alias in node.names
                }
        graph[path] = {path_of[name] for name in imported & path_of.keys()} - {path}
    return graph


def design_graph():
    """{file: the files DESIGN.md says it imports}, in the order of its lines."""
    tree = (ROOT / "DESIGN.md").read_text().split("```")[1]
    tokens = re.findall(r"[\w/]+\.py|──>", re.sub(r"\(.*?\)", "", tree))  # notes, and (none), name no file
    graph = {}
    for token, following in zip(tokens, tokens[1:] + [""]):
        if following == "──>":
            importer = graph.setdefault(token, set())
        elif token != "──>":
            importer.add(token)
    return graph


def test_design_md_draws_every_import_and_no_other():
    code, design = code_graph(), design_graph()
    in_code = {(a, b) for a, imported in code.items() for b in imported}
    in_design = {(a, b) for a, imported in design.items() for b in imported}
    line = {file: number for number, file in enumerate(design)}
    upward = sorted((a, b) for a, b in in_design if b in line and line[a] > line[b])
    problems = [
        *(f"{a} ──> {b} is missing: add {b} to {a}'s line" for a, b in sorted(in_code - in_design)),
        *(f"{a} ──> {b} is not in the code: remove {b} from {a}'s line" for a, b in sorted(in_design - in_code)),
        *(f"{file} has no line: add `{file} ──> ...` or `──> (none)`" for file in sorted(code.keys() - design.keys())),
        *(f"{file} has a line but is no module of ours" for file in sorted(design.keys() - code.keys())),
        *(f"{a} ──> {b} points up: move {b}'s line below {a}'s" for a, b in upward),
    ]
    if problems:
        pytest.fail("DESIGN.md's import tree differs from the code:\n  " + "\n  ".join(problems), pytrace=False)


def test_no_import_cycle():
    try:
        TopologicalSorter(code_graph()).prepare()
    except CycleError as error:  # error.args[1] lists each file before a file that imports it
        pytest.fail("an import cycle among our modules: " + " ──> ".join(reversed(error.args[1])), pytrace=False)
