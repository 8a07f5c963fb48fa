"""docs/ARCHITECTURE.md's claims, checked against the code: every module at most ``MAX_LINES`` lines, and imports in
the directions it states (its "never imports" table, for every import; its graph of ``vit_core``'s module-level
imports, edge for edge). The imports are read with ``ast``: nothing is imported to check them."""

from __future__ import annotations

import ast
import re
from functools import cache
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from webapp.server import gradio_patches

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("vit_core", "webapp", "train", "bench")
MAX_LINES = 400


def _sources() -> list[Path]:
    return [*sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")), ROOT / "app.py"]


def _module(path: Path) -> str:
    """``vit_core/data/images.py`` -> ``vit_core.data.images``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _imports(path: Path) -> tuple[tuple[str, bool, bool], ...]:
    """(absolute name, inside a function, under ``if TYPE_CHECKING``) of every import in ``path``; ``from m import
    x`` names ``m.x``, since x may be a module."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            f = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            t = type_only or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.Import):
                found.extend((a.name, f, t) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([child.module] if child.module else []))
                found.extend((f"{base}.{a.name}", f, t) for a in child.names)
            visit(child, f, t)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return tuple(found)


def _section(title: str) -> str:
    text = ARCHITECTURE.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# ------------------------------------------------------------------------------------------ size


def test_no_module_passes_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def _folders(package: str) -> dict[str, int]:
    """Every folder under ``package`` that holds Python modules (with an ``__init__.py`` or not), and how many
    modules it holds besides its ``__init__.py``."""
    folders = {p.parent for p in (ROOT / package).rglob("*.py") if p.parent != ROOT / package}
    return {f.name: len([p for p in f.glob("*.py") if p.name != "__init__.py"]) for f in folders}


def test_vit_core_is_at_most_7_folders_of_at_most_10_modules():
    """Folders that name the layer (timm's ``models/``, ``layers/``, ``data/``): few of them, each small enough to
    read whole; a folder that grows past 10 modules holds two layers."""
    sizes = _folders("vit_core")
    assert len(sizes) <= 7 and max(sizes.values()) <= 10, sizes


def test_webapp_is_3_modules_at_its_root_and_at_most_6_folders_of_at_most_8():
    root = [p.name for p in (ROOT / "webapp").glob("*.py")]
    sizes = _folders("webapp")
    assert len(root) <= 3 and len(sizes) <= 6 and max(sizes.values()) <= 8, (root, sizes)


# ------------------------------------------------------------------------------- import direction


def _never_imports() -> list[tuple[str, list[str], list[str]]]:
    """The "never imports" table: (package or ``app``, the parts of it the row exempts, the names it never imports)."""
    rules = []
    for line in _section("Import direction").splitlines():
        cells = line.split("|")
        if not line.startswith("|") or "never imports" in line or set(cells[1].strip()) <= {"-"}:
            continue
        subject = re.findall(r"`([^`]+)`", cells[1])
        exempt = [s.replace("/", ".") for s in subject[1:]] if "outside" in cells[1] else []
        rules.append((subject[0].removesuffix(".py"), exempt, re.findall(r"`([^`]+)`", cells[2])))
    return rules


def test_the_never_imports_table_is_read():
    subjects = {s for s, _, _ in _never_imports()}
    assert {"vit_core", "train", "webapp", "app"} <= subjects  # a reworded table must not check nothing


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_in_the_stated_direction(path):
    """Every import (module level, inside functions, for type hints alike) against the table."""
    module = _module(path)
    wrong = []
    for subject, exempt, forbidden in _never_imports():
        if not _within(module, subject) or any(_within(module, e) for e in exempt):
            continue
        wrong += [
            f"{name} ({subject} never imports {f})"
            for name, _, _ in _imports(path)
            for f in forbidden
            if _within(name, f)
        ]
    assert not wrong, f"{module}: {wrong}"


def _floors() -> list[list[str]]:
    """The webapp's floors as docs/ARCHITECTURE.md lists them, lowest first: one line each, its folder (or, for
    the lowest, the root's modules)."""
    text = _section("Import direction")
    block = text[text.index("The app's floors") :]
    block = block[block.index("```\n") + 4 :]
    return [[m.strip() for m in line.split(",")] for line in block[: block.index("```")].strip().splitlines()]


def _floor_of(module: str, floors: list[list[str]]) -> int:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    return next(i for i, floor in enumerate(floors) if name in floor or (i == 0 and name == "__init__"))


@pytest.mark.parametrize("path", sorted((ROOT / "webapp").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_webapp_imports_only_its_floor_and_those_below(path):
    """Each module imports modules of its own floor and lower ones only (every import, module level or not), and
    none inside a function: what a request runs is read at the top of each module."""
    floors, module = _floors(), _module(path)
    assert [f for floor in floors[1:] for f in floor] == sorted(
        {p.parent.name for p in (ROOT / "webapp").glob("*/__init__.py")}, key=[f for fl in floors for f in fl].index
    )  # every folder is a floor
    mine = _floor_of(module, floors)
    up = [name for name, _, _ in _imports(path) if _within(name, "webapp") and _floor_of(name, floors) > mine]
    inside = [name for name, in_function, _ in _imports(path) if in_function]
    assert not up and not inside, f"{module}: imports above its floor {up}, inside a function {inside}"


def test_each_name_of_the_app_is_defined_once():
    """``MB``, ``REFUSED``, ``Caller`` (and any other module-level name the app defines) in one module each, the
    others importing it."""
    defined: dict[str, list[str]] = {}
    for path in [*sorted((ROOT / "webapp").rglob("*.py")), ROOT / "app.py"]:
        if path.parent.name == "tabs":  # each tab's own TITLE, GROUP...: no tab imports another (the table above)
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if isinstance(node, ast.ClassDef | ast.FunctionDef):
                names = [node.name]
            for name in names:
                if name.isupper() or name[0].isupper():  # constants and classes
                    defined.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert {"MB", "REFUSED", "Caller"} <= set(defined)
    twice = {name: where for name, where in defined.items() if len(where) > 1}
    assert not twice, twice


PATCHED_ATTRIBUTES = {"process_api", "get_fn", "push", "upload_fn", "parse", "__class__"}


@pytest.mark.parametrize("path", sorted((ROOT / "webapp").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_gradio_is_patched_in_one_module(path):
    """Only ``webapp/server/gradio_patches.py`` assigns Gradio's functions (``process_api``, ``get_fn``, the
    queue's ``push``, the upload route and its parser) or changes an object's class."""
    if path.name == "gradio_patches.py":
        return
    assigned = [
        ast.unparse(target)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute) and target.attr in PATCHED_ATTRIBUTES
    ]
    assert not assigned, f"{path.name} patches Gradio itself: {assigned}"


def test_what_the_app_patches_is_what_the_running_gradio_has():
    """Each patched Gradio function's source is the one its patch was read against: an upgrade of Gradio that
    changes one fails here (see ``gradio_patches.CHECKED_WITH``)."""
    assert gradio_patches.changed() == [], (gradio_patches.CHECKED_WITH, gradio_patches.changed())


def _stated_graph() -> dict[str, set[str]]:
    """The code block of ``vit_core``'s module-level imports: ``a -> b, c`` lines, and a first line listing the
    modules that import no other."""
    text = _section("Import direction")
    block = text[text.index("Inside `vit_core`") :]
    block = block[block.index("```\n") + 4 :]
    block = block[: block.index("```")]
    graph: dict[str, set[str]] = {}
    for line in block.strip().splitlines():
        line = re.sub(r"\(.*?\)", "", line)
        if "->" in line:
            left, right = line.split("->")
            graph[left.strip()] = {d.strip() for d in right.split(",") if d.strip()}
        else:
            graph.update({m.strip().removesuffix("/*"): set() for m in line.split(",") if m.strip()})
    return graph


def _node(module: str) -> str:
    """A vit_core module's name in the graph: its path under ``vit_core`` (``models.config``; a package's
    ``__init__`` is the package, ``explain``), ``data``'s modules as ``data``, ``vit_core/__init__.py`` as
    ``__init__``."""
    name = module.removeprefix("vit_core").removeprefix(".") or "__init__"
    return "data" if _within(name, "data") else name


def _actual_graph() -> tuple[dict[str, set[str]], list[str]]:
    """vit_core's module-level imports of its own modules, node to node (an import names the longest module it
    reaches: ``from ..models import config`` is ``models.config``), leaving out those for type hints; and the
    imports of one vit_core module by another inside a function. A folder's ``__init__.py`` that holds only its
    docstring is no node."""
    paths = sorted((ROOT / "vit_core").rglob("*.py"))
    empty = {p for p in paths if p.name == "__init__.py" and len(ast.parse(p.read_text()).body) <= 1}
    nodes = {_node(_module(p)) for p in paths if p not in empty}
    graph: dict[str, set[str]] = {}
    inside = []
    for path in paths:
        if path in empty:
            continue
        name = _node(_module(path))
        deps = graph.setdefault(name, set())
        for imported, in_function, type_only in _imports(path):
            parts = imported.split(".")
            if parts[0] != "vit_core" or len(parts) < 2:
                continue
            reached = [".".join(parts[1:i]) for i in range(len(parts), 1, -1)]
            target = next((_node(r) for r in reached if _node(r) in nodes), None)
            if target is None or target == name:
                continue
            if in_function:
                inside.append(f"{_module(path)} imports {imported} in a function")
            elif not type_only:
                deps.add(target)
    return graph, inside


def test_vit_core_imports_are_the_stated_graph_without_a_cycle():
    stated, (actual, inside) = _stated_graph(), _actual_graph()
    assert "models.model" in stated and "explain.lrp" in stated  # the block was found and read
    missing = {m: sorted(actual[m] - stated.get(m, set())) for m in actual if actual[m] - stated.get(m, set())}
    extra = {m: sorted(stated[m] - actual.get(m, set())) for m in stated if stated[m] - actual.get(m, set())}
    unlisted = sorted(set(actual) - set(stated))
    gone = sorted(set(stated) - set(actual))
    assert not (missing or extra or unlisted or gone), (
        f"docs/ARCHITECTURE.md's vit_core graph is out of date: imports it does not state {missing}, edges it states "
        f"that are not there {extra}, modules it does not list {unlisted}, modules that do not exist {gone}"
    )
    assert not inside
    try:
        TopologicalSorter(actual).prepare()
    except CycleError as e:
        pytest.fail(f"vit_core imports in a cycle: {e.args[1]}")


def _signatures() -> list[tuple[str, str, int, int]]:
    """(module, function, required parameters, all parameters) of every function of the library, the app, the
    command line and the benchmarks (``self`` and ``cls`` not counted)."""
    found = []
    for path in [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))] + [ROOT / "app.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                positional = [p.arg for p in a.posonlyargs + a.args if p.arg not in ("self", "cls")]
                own = len(a.posonlyargs + a.args) - len(positional)
                required = len(a.posonlyargs + a.args) - own - len(a.defaults)
                required += sum(d is None for d in a.kw_defaults)
                found.append((_module(path), node.name, required, len(positional) + len(a.kwonlyargs)))
    return found


MAX_REQUIRED = 6  # parameters without a default, anywhere; and all of a tab function's
MAX_PARAMETERS = 10  # all of a function's in the library and the command line


def test_no_function_takes_more_than_6_required_parameters_nor_a_tab_function_more_than_6():
    """Options keyword-only with defaults, and options that travel together grouped: a call with seven
    positional values is one nobody reads right."""
    signatures = _signatures()
    assert len(signatures) > 500  # the code was read
    many = [f"{m}.{f} ({r} required)" for m, f, r, _ in signatures if r > MAX_REQUIRED]
    tabs = [f"{m}.{f} ({n})" for m, f, _, n in signatures if m.startswith("webapp.tabs") and n > MAX_REQUIRED]
    assert not many and not tabs, many + tabs


def test_no_library_or_command_line_function_takes_more_than_10_parameters():
    """Options that travel together are one value (``finetune.FinetuneOptions`` and ``Monitor``,
    ``calibration.CalibrationOptions``, ``evaluation.CalibrationImages``, ``model_card.CardFacts``): a new option
    is then a field, not a parameter added to every function between the caller and its use, and each name means
    one thing wherever it is passed. Before them ``finetune_folder`` took 14 parameters, ``calibrate_checkpoint``
    13, ``calibrate_model`` 12 and ``render_model_card`` 10; the most now is 10 (``calibrate_checkpoint``)."""
    signatures = [s for s in _signatures() if s[0].split(".")[0] in ("vit_core", "train")]
    assert len(signatures) > 300  # the code was read
    many = [f"{m}.{f} ({n})" for m, f, _, n in signatures if n > MAX_PARAMETERS]
    assert not many, f"functions of more than {MAX_PARAMETERS} parameters (group the options): {many}"
