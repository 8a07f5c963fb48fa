"""The app's command-line options about models: the startup model, what web users may choose, the memory limits,
the map shown first (``--default-method``, or ``VIT_DEFAULT_METHOD`` where a Space sets it).

``add_arguments`` adds them to the app's parser; ``configure`` turns the parsed values into ``Options``, which
``webapp.registry.models.Models`` follows, and sets up the server's log.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from vit_core import methods

from ..errors import log
from ..inference.settings import DEFAULT_METHOD

AUTO_MODEL = "auto"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
ALL_INTERFACES = "0.0.0.0"
DEFAULT_METHOD_VARIABLE = "VIT_DEFAULT_METHOD"  # a Space's setting: the --default-method of a server without flags


@dataclass(frozen=True)
class Options:
    """What the operator allows. The defaults are local use: any model by name, generous limits."""

    public: bool = False  # only listed models; local folders only under models/ and runs/
    allow_any: bool = True  # web users may type any folder or Hub repo id
    models: tuple[str, ...] | None = None  # the picker's list; None: bundled + curated (+ runs/ if not public)
    max_loaded: int = 4
    max_loaded_mb: int = 3000
    max_model_mb: int = 2000  # ViT-L/16 needs ~1650 (weights + one explanation's activations)
    failed_ttl: float = 600.0
    request_wait: float = 1.0  # seconds a request waits for a load before answering "still loading"
    default_method: methods.Method = DEFAULT_METHOD  # the map shown before a visitor picks one


def default_method_keys() -> list[str]:
    """The methods a deployer may make the default: those this server runs for every model (no forward passes
    beyond the prediction's: ``settings.affordable`` always holds), by key."""
    return [m.key for m in methods.METHODS if m.cost.forward == 0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The app's model options: the startup model, what web users may choose, and the memory limits."""
    d = Options()
    g = parser.add_argument_group("models")
    g.add_argument(
        "--model",
        default=AUTO_MODEL,
        help="startup model: 'auto' (default: the paper's ViT-B/16 from the Hub when it answers, else the bundled "
        "CIFAR-10 model), 'bundled', a run or checkpoint folder, or a Hub repo id",
    )
    g.add_argument(
        "--public",
        action="store_true",
        help="serve the public: on all interfaces (0.0.0.0) unless --host says otherwise, only the listed models, "
        "local ones only from models/ and runs/ (always on a Space)",
    )
    listed = g.add_mutually_exclusive_group()
    listed.add_argument(
        "--models",
        help="comma-separated models web users may choose (default: the bundled model and the curated ImageNet "
        "checkpoints, plus the run folders when not public)",
    )
    listed.add_argument("--models-file", type=Path, help="the same as a JSON or YAML list in a file")
    g.add_argument(
        "--allow-any-model",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let web users type any folder or Hub repo id (default: only when served on 127.0.0.1/localhost, "
        "without --share, not public)",
    )
    g.add_argument("--max-loaded", type=int, default=d.max_loaded, help="models kept loaded at once")
    g.add_argument("--max-loaded-mb", type=int, default=d.max_loaded_mb, help="MB of weights kept loaded")
    g.add_argument(
        "--max-model-mb",
        type=int,
        default=d.max_model_mb,
        help="largest model attempted: MB of weights plus one explanation's activations",
    )
    g.add_argument("--failed-load-ttl", type=float, default=d.failed_ttl, help="seconds a failed load is remembered")
    g.add_argument(
        "--default-method",
        default=os.environ.get(DEFAULT_METHOD_VARIABLE) or DEFAULT_METHOD.key,
        help=f"the map shown first, one of {', '.join(default_method_keys())} (default: ${DEFAULT_METHOD_VARIABLE}, "
        f"else {DEFAULT_METHOD.key}); LRP-based maps (attnlrp, chefer) are a patented technology, free for personal "
        "and scientific use only (the lxt authors)",
    )


def is_public(args: argparse.Namespace) -> bool:
    """Public mode: ``--public``, and always on a Hugging Face Space."""
    return bool(getattr(args, "public", False) or os.environ.get("SPACE_ID"))


def serving_host(args: argparse.Namespace) -> str:
    """The address the app listens on: ``--host``, else ``GRADIO_SERVER_NAME`` (a Space sets it), else all
    interfaces in public mode and this machine only otherwise."""
    host = getattr(args, "host", None) or os.environ.get("GRADIO_SERVER_NAME")
    return host or (ALL_INTERFACES if is_public(args) else "127.0.0.1")


def configure(args: argparse.Namespace) -> Options:
    """Options from the parsed command line (and ``SPACE_ID``: a Space is public); sets up the log."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    public = is_public(args)
    local = serving_host(args) in LOCAL_HOSTS and not getattr(args, "share", False)
    if public and args.allow_any_model:
        raise SystemExit("--allow-any-model: public mode serves only the listed models")
    allow_any = (local and not public) if args.allow_any_model is None else args.allow_any_model
    models = None
    if args.models is not None:
        models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    elif args.models_file is not None:
        try:
            models = yaml.safe_load(args.models_file.read_text())  # YAML reads JSON lists too
        except (OSError, yaml.YAMLError) as e:
            raise SystemExit(f"--models-file {args.models_file}: {e}") from None
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise SystemExit(f"--models-file {args.models_file}: expected a list of model names")
        models = tuple(models)
    if models == ():
        raise SystemExit("--models: the list is empty")
    limits = {"max_loaded": args.max_loaded, "max_loaded_mb": args.max_loaded_mb, "max_model_mb": args.max_model_mb}
    if min(limits.values()) < 1:
        raise SystemExit(f"--max-loaded, --max-loaded-mb and --max-model-mb must be >= 1, got {limits}")
    if args.default_method not in default_method_keys():
        raise SystemExit(
            f"--default-method: choose one of {', '.join(default_method_keys())}, got {args.default_method!r}"
        )
    method = next(m for m in methods.METHODS if m.key == args.default_method)
    return Options(public, allow_any, models, failed_ttl=args.failed_load_ttl, default_method=method, **limits)
