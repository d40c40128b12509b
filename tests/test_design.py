"""DESIGN.md's import tree and the names our texts give, checked against the code so that they cannot drift.

The tree is DESIGN.md's first fenced block: a line for each module of ours, `importer.py ──> imported.py, ...` (a long
list goes on over the next lines; `──> (none)` where it imports none of ours; notes in parentheses), every arrow
pointing to a line further down. The code's imports are read with ast, not run, so an import inside a function counts
too. Our modules are the .py files at the repository's root and in its packages (folders with __init__.py): `import
parallel.zero`, `from parallel import zero` and, inside the package, `from .zero import X` all name parallel/zero.py.

Every module a text of ours names must exist: in each docstring of our code and scripts, each preset, DESIGN.md, the
README and docs/, a file path (`parallel/grid.py`, `bench/bands.py`, a bare `grid.py`) must be a file, and a dotted
name that starts at a module of ours (`parallel.grid.init_distributed`, `transfer.fit_to_run`, `grid.Launch`) must
resolve, its first name after the module an attribute of it."""

import ast
import importlib
import importlib.util
import json
import re
import sysconfig
import textwrap
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest
from conftest import ROOT

NOT_MODULES = {"tests", "notebooks", "exercises", "bench", "examples"}  # folders of scripts, never imported


def product_files():
    """Our modules, each by its path from the root: the .py files at the root and in our packages."""
    files = [*ROOT.glob("*.py")]
    for init in ROOT.glob("*/__init__.py"):
        if init.parent.name not in NOT_MODULES:
            files += init.parent.rglob("*.py")
    return sorted(file.relative_to(ROOT).as_posix() for file in files)


def code_graph():
    """{file: the files of ours it imports}, each named by its path from the root: train.py, parallel/zero.py."""
    paths = product_files()
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
    tree = next(block for block in (ROOT / "DESIGN.md").read_text().split("```")[1::2] if "──>" in block)
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


# ----------------------------------------------------------------------------
# The names our texts give


def texts_of_ours():
    """[(file, text)]: every docstring of our code and scripts, every string of a preset, and the Markdown."""
    texts = []
    scripts = [
        *ROOT.glob("*.py"),
        *ROOT.glob("parallel/*.py"),
        *ROOT.glob("machinery/**/*.py"),
        *ROOT.glob("bench/*.py"),
    ]
    scripts += [*ROOT.glob("exercises/*.py")]
    for path in [*scripts, ROOT / "notebooks" / "lab.py"]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                texts += [(path, ast.get_docstring(node, clean=False) or "")]
    for path in ROOT.glob("presets/*.json"):
        texts += [(path, json.dumps(json.loads(path.read_text())))]
    return texts + [
        (path, path.read_text()) for path in [ROOT / "DESIGN.md", ROOT / "README.md", *ROOT.glob("docs/*.md")]
    ]


OUR_MODULES = {path.stem: path.stem for path in ROOT.glob("*.py")} | {"parallel": "parallel", "machinery": "machinery"}
# a module of a package by its own name too (grid.Launch, closed_forms.flops_per_token), and machinery's folders; a
# command's entry point (machinery/corpus.py) gives way to the module it runs (machinery/corpora/corpus.py)
for path in [
    *sorted(ROOT.glob("parallel/*.py")),
    *sorted(ROOT.glob("machinery/*.py")),
    *sorted(ROOT.glob("machinery/*/*.py")),
]:
    dotted = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
    OUR_MODULES[dotted.rpartition(".")[2]] = dotted
OUR_FILE_NAMES = {path.name for path in ROOT.rglob("*.py")}  # a bare name: a file of ours wherever it lies
STDLIB = sysconfig.get_paths()["stdlib"]
OTHERS_FILES = {"hellaswag.py": "llm.c's and build-nanogpt's HellaSwag scorer"}  # named as another project's
FILE_PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b")
DOTTED_NAME = re.compile(r"(?<![\w./-])(" + "|".join(sorted(OUR_MODULES, key=len, reverse=True)) + r")((?:\.\w+)+)")
NOT_AN_ATTRIBUTE = re.compile(r"(py|json|jsonl|bin|png|txt|md|safetensors|pt|ipynb|toml)$")  # data.bin: a file


def has_attribute(module, name):
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:  # a module it imports was renamed: the name does not resolve either
        return False


def unresolved(source, text):
    """What `text` (found in the file `source`) names that does not exist, each as `kind name`."""
    problems = []
    for name in FILE_PATH.findall(text):
        places = [source.parent / name, ROOT / name, ROOT / "machinery" / name, Path(STDLIB) / name]
        if not any(place.is_file() for place in places) and name not in OUR_FILE_NAMES | OTHERS_FILES.keys():
            problems.append(f"file {name}")
    for module, attributes in DOTTED_NAME.findall(text):
        module, names = OUR_MODULES[module], attributes[1:].split(".")
        while names and (ROOT / module.replace(".", "/") / f"{names[0]}.py").is_file():  # parallel.grid: a module
            module += "." + names.pop(0)
        if names and not NOT_AN_ATTRIBUTE.match(names[0]) and not has_attribute(module, names[0]):
            problems.append(f"name {module}.{names[0]}")
    return problems


def test_every_module_a_text_names_exists():
    problems = sorted(
        {f"{source.relative_to(ROOT)}: {p}" for source, text in texts_of_ours() for p in unresolved(source, text)}
    )
    if problems:
        pytest.fail("our texts name what the code does not hold:\n  " + "\n  ".join(problems), pytrace=False)


def test_a_renamed_module_or_a_moved_function_is_caught():
    here = ROOT / "parallel" / "__init__.py"
    assert unresolved(here, "grid.py, parallel/grid.py, parallel.grid.init_distributed, transfer.fit_to_run") == []
    assert unresolved(here, "grids.py, parallel.py, parallel.init_distributed, transfer.fit") == [
        "file grids.py",
        "file parallel.py",
        "name parallel.init_distributed",
        "name machinery.interchange.transfer.fit",
    ]


PACKAGES = [
    "parallel",
    "machinery",
    *sorted(p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("machinery/*/__init__.py")),
]


@pytest.mark.parametrize("package", PACKAGES)
def test_the_packages_list_gives_each_file_once(package):
    """A package's __init__.py gives each of its files' jobs in a line: one added without its line is caught."""
    listed = re.findall(r"^ +(\w+\.py) ", importlib.import_module(package.replace("/", ".")).__doc__, re.MULTILINE)
    files = sorted(path.name for path in ROOT.glob(f"{package}/*.py") if path.name != "__init__.py")
    assert sorted(listed) == files, f"{package}/__init__.py lists {sorted(listed)}; {package}/ holds {files}"


def test_the_layout_names_every_flag():
    import parallel.grid
    import parallel.layout

    flags = {f"--{field}" for field in parallel.grid.Layout.__dataclass_fields__} - {"--dist_timeout"}
    missing = flags - set(re.findall(r"--\w+", parallel.layout.__doc__.split("Two functions")[0]))
    assert not missing, f"parallel/layout.py's list of layout flags lacks {sorted(missing)}"


# ----------------------------------------------------------------------------
# The layout: one value


def test_the_layout_is_one_frozen_value_that_no_function_takes_apart():
    """One dataclass holds a layout (parallel.grid.Layout, frozen: checked once, it cannot change after), and no
    function of ours takes its sizes as loose parameters: none has both tp and pp among its parameters."""
    layouts, loose = [], []
    for path in product_files():
        for node in ast.walk(ast.parse((ROOT / path).read_text(), path)):
            if isinstance(node, ast.ClassDef) and {"tp", "pp"} <= {
                target.id
                for statement in node.body
                if isinstance(statement, ast.AnnAssign) and isinstance(target := statement.target, ast.Name)
            }:
                layouts.append((path, node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if {"tp", "pp"} <= {argument.arg for argument in arguments}:
                    loose.append(f"{path}:{node.lineno} {node.name}")
    assert [(path, node.name) for path, node in layouts] == [("parallel/grid.py", "Layout")], layouts
    (decorator,) = layouts[0][1].decorator_list
    frozen = [k for k in getattr(decorator, "keywords", []) if k.arg == "frozen" and getattr(k.value, "value", 0)]
    assert frozen, "parallel.grid.Layout must be @dataclass(frozen=True)"
    assert not loose, f"functions that take tp and pp apart, not a Layout: {loose}"


# ----------------------------------------------------------------------------
# The run: a few components

RUN_FIELDS = 10  # the Run holds components, each owning its state, and nothing else


def test_the_run_is_a_few_components_and_no_function_takes_it():
    """machinery.components.run_setup.Run has at most RUN_FIELDS fields, each a class of ours with methods (a
    component, not a value regrouped); no function of the machinery or train.py has a parameter named run (the
    name means the Run), and none is handed a Run: the Run's own methods are the steps that take several
    components."""
    import dataclasses
    import typing

    from machinery.components.run_setup import Run

    fields = dataclasses.fields(Run)
    assert len(fields) <= RUN_FIELDS, f"the Run has {len(fields)} fields: {[f.name for f in fields]}"
    hints = typing.get_type_hints(Run)
    plain = [f.name for f in fields if not hints[f.name].__module__.startswith("machinery.")]
    assert not plain, f"the Run's fields that are no component of the machinery: {plain}"
    takers = []
    for path in product_files():
        if not (path.startswith("machinery/") or path == "train.py"):
            continue
        for node in ast.walk(ast.parse((ROOT / path).read_text(), path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                takers += [f"{path}:{node.lineno} {node.name}" for a in arguments if a.arg == "run"]
            elif isinstance(node, ast.Call):  # f(run) or f(x, run=run): a Run handed over whole
                handed = [*node.args, *(k.value for k in node.keywords)]
                takers += [f"{path}:{node.lineno}" for a in handed if isinstance(a, ast.Name) and a.id == "run"]
    assert not takers, f"functions that take the Run: {takers}"


# ----------------------------------------------------------------------------
# The lesson one person reads in an afternoon: its budgets

LESSON_LINES = 3000  # the root's *.py and parallel/: what the README's reading path asks a learner to read
ONE_PARALLELISM = ("model.py", "train.py", "data.py", "parallel/grid.py", "parallel/data_parallel.py")
ONE_PARALLELISM_LINES = 1100  # the model, the loop, the tokens and data parallelism, with all they import of the lesson
TRAIN_IMPORTS = 6  # train.py's modules of ours: the loop reaches the machinery through the Run
FILE_LINES = 600  # any file of ours: past this, split it along a seam DESIGN.md shows


def line_count(path):
    """Every line of the file, comments and docstrings included: they are read too."""
    return len((ROOT / path).read_text().splitlines())


def in_the_lesson(path):
    return "/" not in path or path.startswith("parallel/")


def one_parallelism():
    """ONE_PARALLELISM and every file of the lesson they import, directly or not: the shortest whole path."""
    graph, path, unread = code_graph(), set(), list(ONE_PARALLELISM)
    while unread:
        file = unread.pop()
        if file not in path:
            path.add(file)
            unread += [imported for imported in graph[file] if in_the_lesson(imported)]
    return sorted(path)


def test_the_lesson_keeps_its_budgets():
    """Prints and checks the four budgets (python -m pytest tests/test_design.py -k budgets -s shows them)."""
    lesson = sorted(filter(in_the_lesson, product_files()))
    lesson_lines = sum(map(line_count, lesson))
    path = one_parallelism()
    path_lines = sum(map(line_count, path))
    train_imports = sorted(code_graph()["train.py"])
    largest = max(product_files(), key=line_count)
    print(
        f"\nthe lesson ({len(lesson)} files: the root's *.py and parallel/): {lesson_lines:,} lines (at most "
        f"{LESSON_LINES:,})\nthe path to one parallelism ({', '.join(path)}): {path_lines:,} lines (at "
        f"most {ONE_PARALLELISM_LINES:,})\ntrain.py's modules of ours: {len(train_imports)} "
        f"({', '.join(train_imports)}; at most {TRAIN_IMPORTS})\nthe largest file of ours: {largest}, "
        f"{line_count(largest)} lines (at most {FILE_LINES})"
    )
    assert lesson_lines <= LESSON_LINES, f"the lesson has grown to {lesson_lines:,} lines: {lesson}"
    assert path_lines <= ONE_PARALLELISM_LINES, f"the path to one parallelism has grown to {path_lines:,} lines: {path}"
    assert len(train_imports) <= TRAIN_IMPORTS, f"train.py imports {len(train_imports)} modules of ours"
    over = {path: line_count(path) for path in product_files() if line_count(path) > FILE_LINES}
    assert not over, f"files over {FILE_LINES} lines: {over}; split each along a seam, and show it in DESIGN.md"


def test_the_readmes_reading_path_lists_every_file_of_the_lesson():
    """The README's table of the lesson names each of its files once, in the order a reader takes them."""
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `([\w/]+\.py)` \|", readme, re.MULTILINE)
    listed = sorted(set(filter(in_the_lesson, product_files())) - {"parallel/__init__.py"})
    assert sorted(rows) == listed, f"the README's lesson table lists {sorted(rows)}, the lesson is {listed}"


# ----------------------------------------------------------------------------
# The picture of the house, drawn from the imports

FIGURE_START, FIGURE_END = "<!-- the house: drawn by tests/test_design.py -->", "<!-- end of the house -->"


def house_figure():
    """DESIGN.md's picture (a Mermaid flowchart): the lesson's files and the imports among them, machinery's folders
    and the files of the lesson each imports, and what train.py imports of the machinery. The machinery's imports
    among its own files are the tree's, below the picture. errors.py, which every file that refuses an input
    imports, is drawn without its arrows: they would hide the rest."""
    graph = code_graph()
    lesson = sorted(f for f in graph if in_the_lesson(f))

    def place(f):  # machinery/health/incidents.py -> machinery/health/; the lesson's files stand for themselves
        return f if in_the_lesson(f) else f.rpartition("/")[0] + "/"

    folders = sorted({place(f) for f in graph} - set(lesson) - {"machinery/"})  # less its commands' entry points
    node = {f: re.sub(r"\W", "_", f.removesuffix(".py").rstrip("/")) for f in lesson + folders}
    lines = ["```mermaid", "flowchart LR", '  subgraph lesson["the lesson"]']
    lines += [f'    {node[f]}["{f}"]' for f in lesson]
    lines += ["  end", '  subgraph machinery["machinery/"]']
    lines += [f'    {node[f]}["{f.removeprefix("machinery/") or "machinery/"}"]' for f in folders]
    lines.append("  end")
    edges = sorted(
        {
            (place(a), place(b))
            for a in graph
            for b in graph[a]
            if b != "errors.py" and (in_the_lesson(a) or in_the_lesson(b)) and place(a) != place(b) != "machinery/"
        }
    )
    lines += [f"  {node[a]} --> {node[b]}" for a, b in edges]
    return "\n".join([FIGURE_START, *lines, "```", FIGURE_END])


def test_the_picture_of_the_house_is_drawn_from_the_imports():
    design = (ROOT / "DESIGN.md").read_text()
    start, end = design.find(FIGURE_START), design.find(FIGURE_END)
    drawn = design[start : end + len(FIGURE_END)] if 0 <= start < end else "(none)"
    assert drawn == house_figure(), "DESIGN.md's picture differs from the imports: python tests/test_design.py"
    # the lesson imports nothing of the machinery but what train.py's loop calls
    graph = code_graph()
    upward = {(a, b) for a, imported in graph.items() for b in imported if b.startswith("machinery/")}
    upward = {(a, b) for a, b in upward if not a.startswith(("machinery/", "train.py"))}
    assert not upward, f"the lesson imports the machinery: {sorted(upward)}"


def import_tree(design):
    """DESIGN.md's import tree drawn again from the code: each file's line names what it imports now, in an order
    where every arrow points down (the tree's own order kept where the imports allow), with the note each line
    gives in its final parentheses. A new file needs a line with its note first (`file ──> (none)  (its job)`)."""
    tree = next(block for block in design.split("```")[1::2] if "──>" in block)
    notes = dict(re.findall(r"^([\w/]+\.py) +──>.*?  \((.*?)\)\n(?=[\w/]+\.py|$)", tree, re.MULTILINE | re.DOTALL))
    notes = {file: " ".join(note.split()) for file, note in notes.items()}
    graph = code_graph()
    missing = sorted(graph.keys() - notes.keys())
    assert not missing, f"give each new file a line in DESIGN.md's tree, with its job in parentheses: {missing}"
    position = {file: i for i, file in enumerate(notes)}
    importers = {file: {a for a, imported in graph.items() if file in imported} for file in graph}
    order = []
    while len(order) < len(graph):  # the first file in the old order whose importers are all placed already
        placed = set(order)
        order.append(min((f for f in graph if f not in placed and importers[f] <= placed), key=position.get))
    lines = []
    for file in order:
        imported = sorted(graph[file], key=order.index)
        text = f"{file} ──> {', '.join(imported) or '(none)'}  ({notes[file]})"
        lines += textwrap.wrap(text, 120, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
    return "\n" + "\n".join(lines) + "\n"


if __name__ == "__main__":  # python tests/test_design.py: draw the house and the import tree into DESIGN.md again
    design = (ROOT / "DESIGN.md").read_text()
    start, end = design.find(FIGURE_START), design.find(FIGURE_END)
    design = design[:start] + house_figure() + design[end + len(FIGURE_END) :]
    tree = next(block for block in design.split("```")[1::2] if "──>" in block)
    (ROOT / "DESIGN.md").write_text(design.replace(tree, import_tree(design)))
