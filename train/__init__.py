"""``python -m train``: train, fine-tune and evaluate ViTs from small declarative recipes.

A recipe is a Python file in ``train/recipes/`` (or anywhere, given by path) defining a dict ``recipe``
whose keys are ``vit_core.training.recipe.Recipe`` fields, as big_vision's configs are Python files. Keys left out
take the defaults of ``Recipe``; command-line options and ``--set key=value`` override them.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from vit_core.training.recipe import Recipe, RecipeError

RECIPES_DIR = Path(__file__).parent / "recipes"


# words whose full stop ends no sentence ("Neal et al. 2018", "e.g. the hybrid")
_ABBREVIATIONS = ("al.", "e.g.", "i.e.", "cf.", "vs.")


def list_recipes() -> dict[str, str]:
    """Recipe name -> the first sentence of its docstring, whole (a docstring's first line may stop mid-phrase)."""
    out = {}
    for path in sorted(RECIPES_DIR.glob("*.py")):
        if not path.name.startswith("_"):
            out[path.stem] = first_sentence(ast.get_docstring(ast.parse(path.read_text())) or "")
    return out


def recipe_listing(columns: int) -> str:
    """``python -m train list``: each recipe's name and first sentence, wrapped to ``columns`` (at least 40 for the
    sentence) under its own column."""
    recipes = list_recipes()
    width = max(map(len, recipes), default=0)
    indent = " " * (width + 2)
    lines = [f"{name:{width}s}  {doc}" for name, doc in recipes.items()]
    return "\n".join(textwrap.fill(line, max(columns, width + 40), subsequent_indent=indent) for line in lines)


def first_sentence(doc: str) -> str:
    """The first sentence of ``doc``'s first paragraph, on one line: up to the first full stop (or ! ?) that a
    space and a capital, a quote or a bracket follow, or the paragraph's end; the whole paragraph without one."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    for end in re.finditer(r"[.!?](?=\s+[A-Z`'\"(]|$)", paragraph):
        if not paragraph[: end.end()].rsplit(" ", 1)[-1].lower().endswith(_ABBREVIATIONS):
            return paragraph[: end.end()]
    return paragraph


def load_recipe(name_or_path: str) -> dict[str, Any]:
    """The ``recipe`` dict of a recipe file: a name in ``train/recipes/`` or a path to a ``.py`` file."""
    path = Path(name_or_path)
    if path.suffix != ".py":
        path = RECIPES_DIR / f"{name_or_path}.py"
        if not path.is_file():
            raise RecipeError(f"unknown recipe {name_or_path!r}; known: {', '.join(list_recipes())} (or a .py path)")
    elif not path.is_file():
        raise RecipeError(f"recipe file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"train.recipes.{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    recipe = getattr(module, "recipe", None)
    if not isinstance(recipe, dict):
        raise RecipeError(f"{path} must define a dict named 'recipe'")
    return copy.deepcopy(recipe)


def apply_overrides(recipe: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """``key=value`` assignments (``--set``) on a recipe dict, in order. Values are Python literals (``3e-4``,
    ``true``/``True``, ``[0, 5000]``, ``None``) or else plain strings; keys as in ``override``."""
    recipe = copy.deepcopy(recipe)
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep or not key:
            raise RecipeError(f"--set expects key=value, got {assignment!r}")
        recipe = override(recipe, {key: _parse_value(text)})
    return recipe


def override(recipe: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``recipe`` with ``values`` set: ``a.b`` sets key ``b`` of the dict-valued field ``a``
    (``augment.re_prob``, ``model_args.depth``). Unknown keys are caught by ``Recipe.from_dict``."""
    recipe = copy.deepcopy(recipe)
    for key, value in values.items():
        if "." in key:
            outer, inner = key.split(".", 1)
            if outer not in ("model_args", "augment"):
                raise RecipeError(f"--set {key}: only model_args.<field> and augment.<key> take a dotted key")
            recipe.setdefault(outer, {})
            recipe[outer] = dict(recipe[outer]) | {inner: value}
        else:
            recipe[key] = value
    return recipe


def _parse_value(text: str) -> Any:
    lowered = {"true": True, "false": False, "none": None, "null": None}
    if text.lower() in lowered:
        return lowered[text.lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def fit_warmup(
    base: dict[str, Any], assignments: list[str], recipe: dict[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """``recipe`` (``base`` with ``assignments`` applied) with a warmup that fits its epochs, and a note
    saying so (None when nothing changed).

    When the assignments shorten the run (``--epochs 1``) to or below the base recipe's warmup and leave
    ``warmup_epochs`` alone, the warmup keeps its share of the base recipe's run (1 of 15 epochs becomes
    1/15 of 1 epoch), so a quick trial of a recipe works as it stands. Anything else is left as it is."""
    default = Recipe()
    epochs = recipe.get("epochs", default.epochs)
    warmup = recipe.get("warmup_epochs", default.warmup_epochs)
    base_epochs = base.get("epochs", default.epochs)
    chosen = any(a.partition("=")[0] == "warmup_epochs" for a in assignments)
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (epochs, warmup, base_epochs))
    if chosen or not numbers or warmup < epochs or epochs <= 0 or epochs == base_epochs:
        return recipe, None
    fitted = round(warmup * epochs / base_epochs, 4) if warmup < base_epochs else 0.0
    note = (
        f"note: warmup_epochs {warmup:g} does not fit in {epochs:g} epoch(s); using {fitted:g}, the recipe's "
        "share of the run (--set warmup_epochs=X to choose)"
    )
    return recipe | {"warmup_epochs": fitted}, note


def missing_start(recipe: dict[str, Any], base: dict[str, Any], name: str | None) -> None:
    """A recipe whose own starting model is a folder this installation lacks (``finetune_folder``'s bundled model
    comes with a clone of the repository, not with the installed package): a message saying what to give."""
    init = recipe.get("init")
    if init is not None and init == base.get("init") and Path(init).is_absolute() and not Path(init).exists():
        raise RecipeError(
            f"recipe {name} starts from the bundled model {Path(init).name}, which comes with a clone of the "
            "repository, not with the installed package: give --init a run folder of yours, a Hub repo id "
            "(owner/name) or timm:<name>, e.g. --init timm:vit_tiny_patch16_224"
        )


def prog() -> str:
    """The command as it was typed, for usage lines: the installed script's name (``vit-train``), or
    ``python -m train`` when run as a module (``sys.argv[0]`` is then this file, or ``-m`` while starting)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return "python -m train" if name in ("", "__main__.py", "-c") or name.startswith("-m") else name


def shown(path: str | Path) -> str:
    """A path as the command line prints it: relative to the working folder where it lies under it, else the
    folder's or file's name, so that no output carries this machine's absolute paths (a log, a pasted issue)."""
    p = Path(path)
    if not p.is_absolute():
        return str(p)
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return p.name or str(p)
