"""The Hugging Face Hub: publish a checkpoint with its model card; load ViT weights wherever they live.

``from_pretrained(name)`` resolves, in order:

1. a local folder: ours or timm's (``config.json`` with ``architecture`` + ``model.safetensors``), or one written by
   transformers (``config.json`` with ``model_type: "vit"``, converted on load);
2. a local ``.npz`` file of the original JAX release (google-research/vision_transformer);
3. a Hub repo ``owner/name`` (also ``hf-hub:owner/name``, ``owner/name@revision`` and ``owner/name/file.npz``):
   ``config.json`` is fetched first and says which layout the weights are in; a repo without one loads its single
   ``.npz`` file.

Weights are read from safetensors or npz. A repo that only has a pickled ``pytorch_model.bin`` is read with
``torch.load(weights_only=True)``, which rebuilds tensors and plain containers and nothing else; a pickle that needs
more (arbitrary objects, i.e. arbitrary code) is refused. Before the weights are downloaded, ``config.json`` is
validated and the model it declares held to the size limits (``max_params``, ``max_activation_bytes``); before they
are read, the file's header is checked against it (``vit_core.io.checkpoint.load_model``, the one path every loader
ends in).

Downloads go through huggingface_hub and its cache (``HF_HOME`` / ``HF_HUB_CACHE``), so the standard variables apply:
``HF_HUB_OFFLINE=1`` loads cached repos without any network call, ``HF_ENDPOINT`` points at a mirror, ``HF_TOKEN``
authenticates for private and gated repos. Tokens are handed to huggingface_hub and nowhere else: never printed,
logged or written to disk by this module.

Code that judges a repo before loading it (the app's ``webapp.registry.sizing`` and ``webapp.registry.models``)
asks here as well: ``file_sizes`` (the repo's file listing), ``download`` (one file, e.g. ``config.json``) and
``answers`` (one request, no retries). No other module of the project lists, downloads from or uploads to the Hub.
"""

from __future__ import annotations

import re
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import torch
from huggingface_hub import CommitOperationAdd, HfApi, constants, get_token, hf_hub_download, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from ..models.config import ViTConfig
from ..models.model import VisionTransformer
from .calibration_file import read_calibration
from .checkpoint import SizeLimits, check_size, config_from_dict, load_model, save_pretrained
from .convert import PREPROCESSOR_NAME, convert_transformers, load_npz, transformers_config
from .files import CONFIG_NAME, WEIGHTS_NAME, CheckpointError, read_header, read_json, read_weights
from .model_card import prepare_upload

PICKLED_WEIGHTS_NAME = "pytorch_model.bin"
UNREACHABLE = (OfflineModeIsEnabled, ConnectionError, TimeoutError, httpx2.TransportError)  # huggingface_hub's client
CHECKPOINT_FILES = (CONFIG_NAME, WEIGHTS_NAME, PICKLED_WEIGHTS_NAME)  # what a checkpoint folder is read from
LIBRARY = "vit_core"
_NAME = r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?"  # a Hub user or repo name: no leading/trailing '.' or '-'
# A Hub reference: [hf-hub:]owner/name[/file.npz][@revision]
HUB_ID = re.compile(rf"(?:hf-hub:)?(?P<repo>{_NAME}/{_NAME})(?P<file>/[^@]+)?(?:@(?P<rev>.+))?")
# Overrides that leave an eval-mode model's outputs as they were, and so its calibration valid.
_EVAL_NEUTRAL = frozenset({"drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate"})

Fetch = Callable[..., Path | None]  # fetch(filename, optional=False) -> local path, or None if optional and absent


class HubError(CheckpointError):
    """A Hub repo that cannot be reached, found, read or written: the message says why and what to do."""


def from_pretrained(
    name_or_path: str | Path,
    revision: str | None = None,
    token: str | None = None,
    *,
    max_params: int | None = None,
    max_activation_bytes: int | None = None,
    **overrides: Any,
) -> VisionTransformer:
    """Load a ViT from a local folder or file, or from the Hub (see the module docstring for the order).

    ``revision``: branch, tag or commit of a Hub repo. ``token``: for private or gated repos (default:
    ``HF_TOKEN`` or the stored login). ``max_params``, ``max_activation_bytes``: the largest model to
    build (default: ``vit_core.io.checkpoint.SizeLimits.resolve()``), checked before any weights are read.
    ``overrides`` change the config before the weights load, e.g. ``img_size=384`` (position embeddings
    interpolated) or ``drop_path_rate=0.1`` for fine-tuning.
    """
    limits = SizeLimits.resolve(max_params, max_activation_bytes)
    path = Path(name_or_path).expanduser()
    if path.exists():
        return _load_local(path, overrides, limits)
    m = HUB_ID.fullmatch(str(name_or_path))
    if m is None:
        raise CheckpointError(f"{name_or_path}: no such file or folder, and not a Hub repo id ('owner/name')")
    repo_id, filename = m["repo"], (m["file"] or "").strip("/") or None
    return _load_hub(repo_id, filename, revision or m["rev"], token, overrides, limits)


def _load_local(path: Path, overrides: dict[str, Any], limits: SizeLimits) -> VisionTransformer:
    if path.is_file():
        if path.suffix == ".npz":
            return load_npz(path, limits=limits, **overrides)
        raise CheckpointError(
            f"{path}: give the folder holding config.json and the weights, or an original JAX .npz file"
        )
    if not (path / CONFIG_NAME).is_file():
        npz = sorted(path.glob("*.npz"))
        if len(npz) == 1:
            return load_npz(npz[0], limits=limits, **overrides)
        raise CheckpointError(
            f"{path}: no {CONFIG_NAME} (expected a folder written by save_pretrained, timm or transformers)"
        )

    def fetch(filename: str, optional: bool = False) -> Path | None:
        if (path / filename).is_file():
            return path / filename
        if optional:
            return None
        raise CheckpointError(f"{path}: no {filename}")

    return _load_folder(read_json(path / CONFIG_NAME), fetch, str(path), overrides, limits)


def _load_folder(
    d: dict[str, Any], fetch: Fetch, source: str, overrides: dict[str, Any], limits: SizeLimits
) -> VisionTransformer:
    """A checkpoint given its config.json dict ``d`` and a way to fetch its other files.

    The config is checked (types, ranges, size limits) before any weights are fetched, so a repo of
    another kind, or declaring a model too big to build, fails fast."""
    config = f"{source}/{CONFIG_NAME}"
    if "architecture" in d:  # ours or timm's
        cfg = config_from_dict(d, config)
        check_size(cfg.replace(**overrides) if overrides else cfg, limits, config)
        header, read, where = _weights(fetch, source)
        model = load_model(header, read, lambda state: (cfg, dict(state)), where, overrides, limits)
        if set(overrides) <= _EVAL_NEUTRAL:  # another input size (img_size=) gives other probabilities
            model.calibration = read_calibration(d, fetch, source, model)
        return model
    if "model_type" in d:  # transformers
        declared = transformers_config(d, source=config)
        check_size(declared.replace(**overrides) if overrides else declared, limits, config)
        pre = fetch(PREPROCESSOR_NAME, optional=True)
        preprocessor = read_json(pre) if pre else None
        header, read, where = _weights(fetch, source)

        def convert(state: Mapping[str, torch.Tensor]) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
            return convert_transformers(d, state, preprocessor, where)

        return load_model(header, read, convert, where, overrides, limits)
    raise CheckpointError(
        f"{source}/{CONFIG_NAME}: neither 'architecture' (timm, vit_core) nor 'model_type' (transformers); "
        "not a checkpoint this library reads"
    )


def _weights(fetch: Fetch, source: str) -> tuple[dict[str, tuple[int, ...]], Callable[[], Mapping[str, Any]], str]:
    """(tensor shapes by name, a function reading the tensors, the file's name) of a checkpoint's weights."""
    path = fetch(WEIGHTS_NAME, optional=True)
    if path is not None:
        return read_header(path), lambda: read_weights(path), f"{source}/{WEIGHTS_NAME}"
    path = fetch(PICKLED_WEIGHTS_NAME, optional=True)
    if path is not None:
        state = read_pickled_weights(path)  # memory-mapped: shapes known, data not yet read
        return {k: tuple(v.shape) for k, v in state.items()}, lambda: state, f"{source}/{PICKLED_WEIGHTS_NAME}"
    raise CheckpointError(f"{source}: no {WEIGHTS_NAME} (nor {PICKLED_WEIGHTS_NAME})")


def read_pickled_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from a pickled ``.bin``/``.pth``, with ``torch.load(weights_only=True)`` only.

    Unpickling can run arbitrary code, so only files that unpickle to tensors and plain containers are
    accepted; timm-style ``{'state_dict': ...}`` / ``{'model': ...}`` wrappers are unwrapped.
    """
    try:
        # memory-mapped (zip format, every file torch >= 1.6 writes): only the tensors used are ever read
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # UnpicklingError, RuntimeError, EOFError...: all mean "not plain weights"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path}: refused. Pickled weight files can run arbitrary code when loaded, so they are only read "
            f"with torch.load(weights_only=True), which failed: {reason}. Ask the publisher for a "
            "model.safetensors, or convert this file yourself if you trust its source."
        ) from None
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: does not hold a state dict (name -> tensor)")
    return obj


def _load_hub(
    repo_id: str,
    filename: str | None,
    revision: str | None,
    token: str | None,
    overrides: dict[str, Any],
    limits: SizeLimits,
) -> VisionTransformer:
    source = repo_id + (f"@{revision}" if revision else "")
    fetch = _hub_fetcher(repo_id, revision, token)
    if filename is not None:
        if not filename.endswith(".npz"):
            raise CheckpointError(f"{source}: only .npz files load by name; for a checkpoint give the repo id alone")
        return load_npz(fetch(filename), limits=limits, **overrides)
    config = fetch(CONFIG_NAME, optional=True)
    if config is not None:
        return _load_folder(read_json(config), fetch, source, overrides, limits)
    files = _list_files(repo_id, revision, token)
    npz = [f for f in files if f.endswith(".npz")]
    if len(npz) == 1:
        return load_npz(fetch(npz[0]), limits=limits, **overrides)
    if npz:
        raise HubError(f"{source}: no {CONFIG_NAME} and several .npz files; name one: '{repo_id}/{npz[0]}'")
    raise HubError(f"{source}: no {CONFIG_NAME} and no .npz file (files: {', '.join(files[:10]) or 'none'})")


def _hub_fetcher(repo_id: str, revision: str | None, token: str | None) -> Fetch:
    def fetch(filename: str, optional: bool = False) -> Path | None:
        try:
            with _hub_errors(repo_id, revision, token):
                return Path(hf_hub_download(repo_id, filename, revision=revision, token=token, library_name=LIBRARY))
        except LocalEntryNotFoundError:
            cached = try_to_load_from_cache(repo_id, filename, revision=revision)
            if optional and cached is not None and not isinstance(cached, str):  # known not to exist
                return None
            if constants.HF_HUB_OFFLINE:
                raise HubError(
                    f"{repo_id}: {filename} is not in the local cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE "
                    "is set, so nothing is downloaded. Load it once with network access (or run "
                    f"`hf download {repo_id}`), or unset HF_HUB_OFFLINE."
                ) from None
            raise HubError(
                f"{repo_id}: could not reach {constants.ENDPOINT} to fetch {filename}, and it is not in the local "
                f"cache ({constants.HF_HUB_CACHE}). Check the network connection (and HF_ENDPOINT if you use a mirror)."
            ) from None
        except EntryNotFoundError:
            if optional:
                return None
            raise HubError(
                f"{repo_id}: no file {filename!r}" + (f" at revision {revision!r}" if revision else "")
            ) from None

    return fetch


def _list_files(repo_id: str, revision: str | None, token: str | None) -> list[str]:
    if constants.HF_HUB_OFFLINE:
        raise HubError(
            f"{repo_id}: no {CONFIG_NAME} in the local cache and HF_HUB_OFFLINE is set, so the repo cannot be "
            f"listed; name the weights file ('{repo_id}/FILE.npz') or go online once."
        )
    with _hub_errors(repo_id, revision, token):
        return HfApi(library_name=LIBRARY).list_repo_files(repo_id, revision=revision, token=token)


def offline() -> bool:
    """Whether huggingface_hub is set to make no network call (``HF_HUB_OFFLINE``)."""
    return constants.HF_HUB_OFFLINE


def answers(name: str, timeout: float = 5.0) -> bool:
    """Whether the Hub (``HF_ENDPOINT``) answers one request about the repo ``name`` (``owner/name``, or with
    a file path after it) within ``timeout`` seconds. huggingface_hub retries an unreachable endpoint for
    about 30 s per file; this asks once."""
    repo = "/".join(name.split("/")[:2])
    try:
        urllib.request.urlopen(f"{constants.ENDPOINT}/api/models/{repo}", timeout=timeout).close()
    except urllib.error.HTTPError:
        return True  # an answer, if not a yes: the load says what is wrong
    except (OSError, ValueError):
        return False
    return True


def file_sizes(repo_id: str, revision: str | None = None, filename: str | None = None) -> dict[str, int] | None:
    """{path: bytes} of a Hub repo's files (or of ``filename`` alone), from the Hub's file listing, before
    anything is downloaded; offline (``HF_HUB_OFFLINE``), those of ``CHECKPOINT_FILES`` (or ``filename``)
    in the local cache. None when the Hub says the repo or revision does not exist or is gated
    (``from_pretrained`` says which); ``HubError`` when it does not answer."""
    if constants.HF_HUB_OFFLINE:
        names = [filename] if filename else CHECKPOINT_FILES
        cached = {n: try_to_load_from_cache(repo_id, n, revision=revision) for n in names}
        return {n: Path(p).stat().st_size for n, p in cached.items() if isinstance(p, str)}
    try:
        listing = HfApi(library_name=LIBRARY).list_repo_tree(repo_id, revision=revision, recursive=bool(filename))
        sizes = {e.path: e.size for e in listing if getattr(e, "size", None) is not None}
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError):
        return None
    except Exception:  # network or server trouble
        raise HubError(f"{repo_id}: the Hub did not answer with the repo's file list; try again later") from None
    if filename:
        return {filename: sizes[filename]} if filename in sizes else {}
    return sizes


def download(repo_id: str, filename: str, revision: str | None = None, token: str | None = None) -> Path:
    """One file of a Hub repo: from the local cache, else downloaded into it (``HubError`` says why not)."""
    return _hub_fetcher(repo_id, revision, token)(filename)


@contextmanager
def _hub_errors(repo_id: str, revision: str | None, token: str | None) -> Iterator[None]:
    """Turn huggingface_hub's HTTP errors into ``HubError`` messages that say what to do (tokens redacted).
    Missing files (``EntryNotFoundError``) pass through for the caller to decide."""
    endpoint = constants.ENDPOINT
    try:
        yield
    except EntryNotFoundError:
        raise
    except GatedRepoError:
        msg = (
            f"{repo_id} is gated: accept its conditions at {endpoint}/{repo_id} while logged in, then set HF_TOKEN "
            "(or pass token=) to a token of that account."
        )
    except RepositoryNotFoundError:
        access = (
            "If it is private, the token in use has no access to it."
            if token or get_token()
            else "If it is private, set HF_TOKEN (or pass token=) to a token with read access."
        )
        msg = f"{repo_id}: no such model repo on {endpoint} (and no local file or folder of that name). {access}"
    except RevisionNotFoundError:
        msg = f"{repo_id}: no revision {revision!r} (a branch, tag or commit of the repo)"
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        msg = f"{repo_id}: the Hub at {endpoint} answered {status}: {e.server_message or e}"
    except UNREACHABLE as e:  # offline mode, a refused or dropped connection, a timeout
        msg = f"{repo_id}: {_unreachable(e)}"
    else:
        return
    raise HubError(_redact(msg, token))


def _unreachable(e: BaseException) -> str:
    if isinstance(e, OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set on this machine, so the Hub is not contacted; unset it to reach the Hub."
    return f"the Hub at {constants.ENDPOINT} could not be reached ({type(e).__name__}); check the network, then retry."


def _redact(text: str, token: str | None) -> str:
    for secret in {token, get_token()} - {None, ""}:
        text = text.replace(secret, "***")
    return text


def push_to_hub(
    source: VisionTransformer | str | Path,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    commit_message: str | None = None,
    license: str = "apache-2.0",
    dataset: str | None = None,
) -> str:
    """Upload a model, or a checkpoint / training run folder, to the Hub repo ``repo_id`` (created if
    needed) with a generated ``README.md`` model card. Returns the commit's URL.

    From a run folder the card carries the final accuracy of ``metrics.jsonl``, the recipe and the
    training curves. ``token`` defaults to ``HF_TOKEN`` or the stored login and needs write access.
    ``config.json`` is timm's layout, so ``timm.create_model('hf-hub:' + repo_id, pretrained=True)`` loads
    the repo as well as ``vit_core.from_pretrained(repo_id)``.
    """
    if not (token or get_token()):
        raise HubError("pushing needs a Hugging Face token with write access: set HF_TOKEN or run `hf auth login`")
    is_model = isinstance(source, VisionTransformer)
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_pretrained(source, tmp) if is_model else Path(source)
        files, card = prepare_upload(folder, repo_id, license=license, dataset=dataset)
        operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(p)) for name, p in files.items()]
        operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode()))
        api = HfApi(token=token, library_name=LIBRARY)
        message = commit_message or ("Upload model" if is_model else f"Upload run {folder.name}")
        try:
            repo = api.create_repo(repo_id, private=private, exist_ok=True)
            info = api.create_commit(repo.repo_id, operations, commit_message=message)
        except HfHubHTTPError as e:
            status = e.response.status_code if e.response is not None else "?"
            hint = " (the token needs write access to that namespace)" if status in (401, 403) else ""
            msg = f"could not push to {repo_id}: the Hub answered {status}{hint}: {e.server_message or e}"
            raise HubError(_redact(msg, token)) from None
        except UNREACHABLE as e:
            raise HubError(_redact(f"could not push to {repo_id}: {_unreachable(e)}", token)) from None
        except ValueError as e:  # the Hub rejected the card's metadata (e.g. an unknown --license)
            raise HubError(_redact(f"could not push to {repo_id}: {e}", token)) from None
    return info.commit_url
