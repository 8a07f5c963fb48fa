"""The app's model layer (``webapp.registry.models``, ``access``, ``sizing``, ``catalog``) in-process, against a local
Hub (``tests/hub_server.py``) serving repos laid out as the paper's checkpoints on the Hub: what web users
may load, what it may cost, how the cache is bounded and keyed, and what people read when it fails."""

from __future__ import annotations

import argparse
import gc
import io
import json
import logging
import math
import os
import platform
import re
import socket
import threading
import time
import tracemalloc
import weakref
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from huggingface_hub import constants
from PIL import Image

import vit_core
from tests.hub_server import FakeHub, _Handler, timm_vit_files, transformers_vit_files
from tests.rss import rss_mb
from vit_core.models.cost import state_shapes
from webapp import resources
from webapp.errors import public
from webapp.inference import analysis
from webapp.registry import access, models, options
from webapp.registry.catalog import AUTO, BUNDLED, BUNDLED_LABEL, CURATED, ROOT, imagenet_names
from webapp.registry.models import Models
from webapp.registry.options import Options
from webapp.ui.endpoints import user_error

CPU = torch.device("cpu")
B16 = "google/vit-base-patch16-224"
TI16 = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"
TINY = {"embed_dim": 32, "depth": 2, "num_heads": 2}
ARCHITECTURES = {  # the vit_core/timm architecture of each curated repo
    B16: "vit_base_patch16_224",
    "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k": "vit_base_patch16_224",
    "timm/vit_base_patch32_224.augreg_in21k_ft_in1k": "vit_base_patch32_224",
    "google/vit-large-patch16-224": "vit_large_patch16_224",
    "timm/vit_base_r50_s16_384.orig_in21k_ft_in1k": "vit_base_r50_s16_384",
    TI16: "vit_tiny_patch16_224",
}


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A local Hub serving tiny copies of two curated repos, and an empty huggingface_hub cache pointing at it."""
    home = tmp_path / "hf_home"
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    server = FakeHub().start()
    _endpoint(monkeypatch, server.url)
    server.add_repo(B16, transformers_vit_files(dict(enumerate(imagenet_names()))))
    server.add_repo(TI16, timm_vit_files("vit_tiny_patch16_224", "augreg_in21k_ft_in1k", TINY))
    yield server
    server.stop()


def _endpoint(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: connections are refused


def _checkpoint(folder: Path, **changes) -> Path:
    torch.manual_seed(0)
    cfg = vit_core.ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    vit_core.save_pretrained(vit_core.create_model(cfg.replace(**changes)), folder)
    return folder


def _error(models_: Models, choice: str, **kw) -> str:
    with pytest.raises(gr.Error) as e:
        models_.get(choice, **kw)
    return e.value.message


# ------------------------------------------------------------------------------------ the curated list


def test_curated_sizes_are_the_architectures_sizes():
    for entry in CURATED:
        params = sum(math.prod(s) for s in state_shapes(vit_core.get_config(ARCHITECTURES[entry.repo])).values())
        assert entry.params == params, entry.repo
        assert entry.download_mb == pytest.approx(4 * params / 1e6, rel=0.01), entry.repo  # float32 safetensors
        assert f"{entry.download_mb:.0f} MB" in entry.label and entry.format in entry.label
    assert AUTO.repo == B16
    assert CURATED[0].label == "ViT-B/16 (ImageNet, 86.6M params, 346 MB, transformers)"


def test_picker_lists_the_bundled_and_curated_models():
    m = Models(CPU)
    choices = m.choices()
    assert choices[0] == (BUNDLED_LABEL, BUNDLED_LABEL)
    assert [value for _, value in choices[1:7]] == [c.repo for c in CURATED]
    assert m.allow_custom_value
    public = Models(CPU, Options(public=True, allow_any=False))
    assert [v for _, v in public.choices()] == [BUNDLED_LABEL, *(c.repo for c in CURATED)]  # no run folders
    assert not public.allow_custom_value


# ------------------------------------------------------------------------------------ --model auto


def test_auto_loads_the_hubs_b16_with_its_imagenet_labels(hub):
    m = Models(CPU)
    assert m.set_default("auto") == B16
    model, transform = m.get(B16)
    assert transform(Image.new("RGB", (50, 40))).shape == (3, 224, 224)
    assert model.label_names == list(imagenet_names()) and model.label_names[0] == "tench, Tinca tinca"
    assert model.config.norm_eps == 1e-12  # converted from the transformers layout
    assert m.note(B16) == " The server starts on the paper's ViT-B/16 (ImageNet-1k), from the Hub."
    assert m.note(BUNDLED_LABEL) == ""
    assert m.choices()[0][1] == B16 and m.default == B16


def test_auto_falls_back_to_the_bundled_model_when_the_hub_does_not_answer(hub, monkeypatch):
    _endpoint(monkeypatch, f"http://127.0.0.1:{_dead_port()}")
    m = Models(CPU)
    m.get(BUNDLED_LABEL, wait=60)  # loaded already: what is timed below is the Hub's part
    t0 = time.perf_counter()
    assert m.set_default("auto") == BUNDLED_LABEL
    assert time.perf_counter() - t0 < 5  # one refused connection, not huggingface_hub's 30 s of retries
    assert m.note(BUNDLED_LABEL) == (
        " The Hugging Face Hub did not answer. The server started on its own small CIFAR-10 model instead of the "
        "paper's ViT-B/16."
    )
    assert m.get(BUNDLED_LABEL)[0].label_names[3] == "cat"
    # the Hub's models cannot load for now (a pick would be refused at once): the picker says so, after the rest
    labels = m.choices()
    assert labels[0] == (BUNDLED_LABEL, BUNDLED_LABEL)
    assert labels[-len(CURATED) :] == [(f"{c.label} — {models.HUB_DOWN}", c.repo) for c in CURATED]
    monkeypatch.setattr(m, "_hub_down_until", 0.0)  # HUB_RETRY seconds later: asked again when picked
    assert [label for label, _ in m.choices()[1:7]] == [c.label for c in CURATED]


def test_auto_falls_back_when_offline_or_when_the_download_fails(hub, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    m = Models(CPU)
    assert m.set_default("auto") == BUNDLED_LABEL
    assert m.note(BUNDLED_LABEL).startswith(" This server is offline (no Hugging Face Hub). The server started on")
    assert "--model" not in m.note(BUNDLED_LABEL) and "HF_HUB_OFFLINE" not in m.note(BUNDLED_LABEL)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.repos.pop(B16)  # the Hub answers, but has no such repo
    m = Models(CPU)
    assert m.set_default("auto") == BUNDLED_LABEL
    assert m.note(BUNDLED_LABEL).startswith(" Could not load 'ViT-B/16 (ImageNet")
    assert m.choices()[1] == (CURATED[0].label, B16)  # the Hub answers: offered as it is


def test_offline_the_hub_models_are_marked_and_refused_at_once_unless_cached(hub, monkeypatch):
    """Offline, a Hub model the local cache does not hold cannot load: the picker marks it (after the models that
    load) and picking it is refused at once, saying why; one the cache holds is offered and loads as usual."""
    assert Models(CPU).get(TI16, wait=60)[0].config.embed_dim == 32  # downloaded into the cache
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    m = Models(CPU)
    labels = {value: label for label, value in m.choices()}
    assert labels[TI16] == CURATED[-1].label
    uncached = [c for c in CURATED if c.repo != TI16]
    assert [labels[c.repo] for c in uncached] == [f"{c.label} — needs the Hub: offline" for c in uncached]
    assert [value for _, value in m.choices()][-len(uncached) :] == [c.repo for c in uncached]
    asked = len(hub.requests)
    refused = _error(m, B16, wait=60)
    assert refused == f"Could not load '{CURATED[0].label}': it needs the Hub, and this server is offline."
    assert m.get(TI16, wait=60)[0].config.embed_dim == 32  # from the cache
    assert len(hub.requests) == asked  # offline: the Hub was not asked


def test_timm_imagenet_models_without_names_get_imagenets(hub):
    model, _ = Models(CPU).get(TI16, wait=60)
    assert model.label_names == list(imagenet_names())


# ------------------------------------------------------------------------------------ what may load


def test_every_spelling_of_a_checkpoint_is_one_cache_entry(hub, tmp_path, monkeypatch):
    d = _checkpoint(tmp_path / "d")
    (tmp_path / "link").symlink_to(d)
    monkeypatch.chdir(tmp_path)
    m = Models(CPU)
    spellings = ["d", "d/", "d/.", "d//", "./d", str(d), f"{tmp_path}//d/", "link", " d "]
    loaded = {id(m.get(s, wait=30)[0]) for s in spellings}
    assert len(loaded) == 1 and len(m._loaded) == 1
    for s in ("org/m", "hf-hub:org/m", "org/m@main", "hf-hub:org/m@main", " org/m "):
        assert access.parse(s).key == "hub:org/m@main"
    assert access.parse("org/m@v1").key != access.parse("org/m").key
    assert m.key_of(B16) == m.key_of(f"hf-hub:{B16}@main") == m.key_of(CURATED[0].label)


def test_public_mode_serves_only_the_list_and_never_says_whether_a_path_exists(hub, tmp_path):
    d = _checkpoint(tmp_path / "d")
    m = Models(CPU, Options(public=True, allow_any=False))
    refusals = {_error(m, text) for text in (str(d), str(tmp_path / "missing"), "~/.ssh", "/etc", "nobody/vit", "..")}
    assert refusals == {access.NOT_SERVED}
    assert m.get(f"hf-hub:{TI16}@main", wait=60)[0].config.embed_dim == 32  # a listed repo, spelled differently
    with pytest.raises(SystemExit, match="only from models/ and runs/"):
        Models(CPU, Options(public=True, allow_any=False, models=(str(d),)))
    bundled_again = f"{BUNDLED.relative_to(ROOT)}/."
    listed = Models(CPU, Options(public=True, allow_any=False, models=("bundled", bundled_again, TI16)))
    assert [v for _, v in listed.choices()] == [BUNDLED_LABEL, TI16]  # one entry per checkpoint


def test_uploads_are_never_models(hub, tmp_path, monkeypatch):
    uploads = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(uploads))
    upload = _checkpoint(uploads / "0123abcd" / "vit")
    for opts, says in ((Options(), access.UPLOADED), (Options(public=True, allow_any=False), access.NOT_SERVED)):
        m = Models(CPU, opts)
        for text in (str(upload), str(uploads / "0123abcd" / "missing.npz"), f"{uploads}/../gradio/0123abcd/vit"):
            assert _error(m, text) == says  # public mode: the one refusal it gives every value not in its list
    (tmp_path / "innocent").symlink_to(upload)  # a link out of the upload folder
    assert _error(Models(CPU), str(tmp_path / "innocent")) == access.UPLOADED


def test_free_text_is_for_local_use(hub, tmp_path):
    d = _checkpoint(tmp_path / "d")
    assert Models(CPU, Options(allow_any=True)).get(str(d), wait=30)[0].config.num_classes == 10
    assert _error(Models(CPU, Options(allow_any=False)), str(d)) == access.NOT_SERVED
    assert "Give a model folder or a Hub repo id" in _error(Models(CPU), "not a model!")


# ------------------------------------------------------------------------------------ what it may cost


def _timm_config(architecture: str, **model_args) -> dict:
    return {"architecture": architecture, "num_classes": 1000, "model_args": model_args}


def _transformers_config(hidden: int, layers: int) -> dict:
    d = json.loads(transformers_vit_files({0: "a", 1: "b"})["config.json"])
    return d | {"hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": layers}


DECLARED = {
    "206 G parameters": _timm_config("vit_base_patch16_224", embed_dim=16384, depth=64, num_heads=16),
    "transformers, 206 G parameters": _transformers_config(16384, 64),
    "632 M parameters at 21,317 tokens": _timm_config("vit_huge_patch14_224", img_size=2044),
    "5.7 M parameters in 1 KB of weights": _timm_config("vit_tiny_patch16_224"),  # within the limit
}


@pytest.mark.parametrize("case", sorted(DECLARED))
def test_declared_models_beyond_the_limit_or_the_weights_are_refused_before_allocating(hub, case):
    hub.add_repo("mallory/vit", {"config.json": json.dumps(DECLARED[case]).encode(), "model.safetensors": b"\0" * 1024})
    m = Models(CPU, Options(max_model_mb=1000))
    tracemalloc.start()
    message = _error(m, "mallory/vit", wait=60)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert re.search(r"declares [\d,]+ parameters", message), message
    assert peak < 100 * 2**20
    assert not any(path.endswith("model.safetensors") for _, path in hub.requests if "resolve" in path)


def test_weight_files_beyond_the_limit_are_refused_before_downloading(hub, tmp_path):
    files = timm_vit_files("vit_tiny_patch16_224", "x", TINY)
    files["model.safetensors"] += b"\0" * (3 * 2**20)  # 3 MB of weights against a 2 MB limit
    hub.add_repo("mallory/big", files)
    message = _error(Models(CPU, Options(max_model_mb=2)), "mallory/big", wait=30)
    assert "its weights are 3 MB; this server loads at most 2 MB" in message
    assert not any(p.endswith("/model.safetensors") for m_, p in hub.requests if m_ == "GET")


def _npz_bomb(path: Path) -> Path:
    """An npz whose one array declares 50000 x 50000 float32 (10 GB) in a few hundred bytes: only the header."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (50000, 50000)})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("embedding/kernel.npy", header.getvalue())
    return path


def test_npz_sizes_come_from_their_headers(hub, tmp_path):
    bomb = _npz_bomb(tmp_path / "ViT-B_16.npz")
    message = _error(Models(CPU), str(bomb), wait=30)
    assert message == (
        f"Could not load '{bomb}': its .npz is refused: not a readable .npz of arrays "
        "(embedding/kernel.npy is shorter than its declared shape (50000, 50000))."
    )


# ------------------------------------------------------------------------------------ memory and waiting


def test_failed_loads_are_remembered_and_answered_from_memory(hub, caplog):
    m = Models(CPU)
    first = _error(m, "nobody/missing-vit", wait=30)
    requests = len(hub.requests)
    caplog.clear()
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="webapp"):
        again = _error(m, "hf-hub:nobody/missing-vit@main")  # another spelling: the same key, remembered
    # ... and answered in this request's own spelling, never an earlier request's
    assert again == first.replace("'nobody/missing-vit'", "'hf-hub:nobody/missing-vit@main'") != first
    assert time.perf_counter() - t0 < 0.1 and len(hub.requests) == requests
    assert len(caplog.records) == 1 and "(remembered)" in caplog.records[0].getMessage()
    retried = Models(CPU, Options(failed_ttl=0))
    _error(retried, "nobody/missing-vit", wait=30)
    _error(retried, "nobody/missing-vit", wait=30)
    assert len(hub.requests) > requests + 2


def test_the_cache_is_bounded_by_count_and_bytes_least_recently_used_first(tmp_path):
    folders = [str(_checkpoint(tmp_path / f"m{i}", embed_dim=192, depth=3)) for i in range(4)]  # 5.5 MB each
    m = Models(CPU, Options(max_loaded=3))
    m.set_default(folders[0])
    for f in folders[1:3]:
        m.get(f, wait=30)
    m.get(folders[1])  # now m2 is the least recently used
    m.get(folders[3], wait=30)
    assert [x.choice.source for x in m._loaded.values()] == [os.path.realpath(folders[i]) for i in (0, 1, 3)]
    tight = Models(CPU, Options(max_loaded_mb=12))  # room for the startup model and one more
    tight.set_default(folders[0])
    for f in folders[1:]:
        tight.get(f, wait=30)
    assert len(tight._loaded) == 2 and tight.key_of(folders[0]) in tight._loaded  # the startup model stays
    # what a request's memory estimate asks: loaded or not, without loading or logging anything
    assert tight.loaded(folders[1]) is None and tight.key_of(folders[1]) not in tight._loading
    model, transform = tight.loaded(folders[0])
    assert (model, transform) == tight.get(folders[0])
    assert Models(CPU, Options(public=True)).loaded("/etc") is None  # refused: None, not an error


def test_a_model_evicted_or_forgotten_is_freed_whatever_the_analyses_cached(tmp_path):
    """Issue 66: with ``max_loaded=2``, 8 models loaded and each analysing an image left 8 of 8 model objects alive
    (each cached ``Analysis`` held its model). Counted with weak references: at most the two loaded and the one a
    request holds; a model loaded again gets its image analysed anew (its old analysis is not answered)."""
    folders = [str(_checkpoint(tmp_path / f"m{i}")) for i in range(8)]
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(photo)
    m = Models(CPU, Options(max_loaded=2, allow_any=True))
    m.set_default(folders[0])
    refs = []
    for f in folders:
        model, transform = m.get(f, wait=30)
        a = analysis.analyse(model, transform, m.key_of(f), str(photo), CPU)
        assert a.model is model
        refs.append(weakref.ref(model))
        del model, a
    gc.collect()
    assert sum(r() is not None for r in refs) <= 3, [r() is not None for r in refs]
    again, transform = m.get(folders[1], wait=30)
    a = analysis.analyse(again, transform, m.key_of(folders[1]), str(photo), CPU)
    assert a.model is again


def test_a_slow_load_does_not_hold_up_other_requests(hub, monkeypatch):
    release = threading.Event()
    original = _Handler._dispatch

    def dispatch(self, method):
        if "slow-vit" in self.path:
            release.wait(30)
        original(self, method)

    monkeypatch.setattr(_Handler, "_dispatch", dispatch)
    hub.add_repo("mallory/slow-vit", timm_vit_files("vit_tiny_patch16_224", "x", TINY))
    m = Models(CPU)
    m.set_default(BUNDLED_LABEL)
    t0 = time.perf_counter()
    assert "is still loading; try again in a moment" in _error(m, "mallory/slow-vit", wait=0.5)
    assert time.perf_counter() - t0 < 2
    t0 = time.perf_counter()
    m.get(BUNDLED_LABEL)
    m.get(TI16, wait=60)  # another model loads meanwhile, on the second worker
    assert time.perf_counter() - t0 < 10
    release.set()
    assert m.get("mallory/slow-vit", wait=60)[0].config.embed_dim == 32  # the same load, joined


def test_a_hub_that_hangs_never_holds_up_local_loads(tmp_path, monkeypatch):
    """A Hub that takes connections and never answers: after the first Hub load finds it silent, further Hub
    loads are refused at once for HUB_RETRY seconds, at most MAX_HUB_LOADS run at a time, and a local folder
    loads on workers of its own meanwhile."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(128)  # the kernel completes connections; nobody ever reads or answers
        _endpoint(monkeypatch, f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(models, "HUB_ANSWER_TIMEOUT", 1.0)
        m = Models(CPU)
        t0 = time.perf_counter()
        messages = [_error(m, f"nobody/made-up-{i}", wait=0) for i in range(40)]
        assert time.perf_counter() - t0 < 2  # nobody waits for the Hub
        busy = sum("Hub downloads are under way" in msg for msg in messages)
        assert busy == 40 - models.MAX_HUB_LOADS, messages
        folder = _checkpoint(tmp_path / "local")
        t0 = time.perf_counter()
        assert m.get(str(folder), wait=30)[0].config.embed_dim == 32
        assert time.perf_counter() - t0 < 5  # the Hub's workers are stuck; the local ones are free
        time.sleep(1.5)  # the first Hub load has found the Hub silent by now
        refused = _error(m, "nobody/another-vit", wait=0)
        assert "the Hub did not answer just now; try again in" in refused, refused
        assert refused.startswith("Could not load 'nobody/another-vit':") and refused.endswith(" s.")


def test_free_text_messages_name_what_was_asked(tmp_path, monkeypatch):
    """Local use: a path that is not there is "no such folder" (not a Hub id); "~nosuchuser" is a user message,
    not an internal error; a failed folder is named as each request spelled it (a link, then its target)."""
    monkeypatch.chdir(ROOT)
    m = Models(CPU)
    assert _error(m, "runs/nope") == "No such folder: 'runs/nope'."
    assert _error(m, "./nope/model") == "No such folder: './nope/model'."
    assert _error(m, "~nosuchuser-vit/model") == "No such folder: '~nosuchuser-vit/model'."  # was a RuntimeError
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    link = tmp_path / "link"
    link.symlink_to(broken)
    first = _error(m, str(link), wait=30)
    assert first.startswith(f"Could not load '{link}':"), first
    again = _error(m, str(broken), wait=30)  # remembered under the same key, named as this request names it
    assert again.startswith(f"Could not load '{broken}':") and str(link) not in again, again


def test_memory_is_returned_after_a_failed_load(tmp_path, monkeypatch):
    """A 50 M-parameter checkpoint whose load fails after the model is built (here: its preprocessing): each
    attempt reads 200 MB of weights and builds a 200 MB model, and all of it goes back to the OS."""
    folder = _checkpoint(tmp_path / "big", img_size=224, patch_size=16, embed_dim=1024, depth=4, num_heads=8)

    def broken(*args, **kwargs):
        raise RuntimeError("preprocessing that cannot be built")

    m = Models(CPU)
    m.set_default(BUNDLED_LABEL)
    monkeypatch.setattr(models, "build_transform", broken)
    resources.release_memory()
    before = rss_mb()
    for _ in range(3):
        assert "unexpected error" in _error(m, str(folder), wait=120)
        m._failed.clear()
    assert rss_mb() - before < 100


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_glibc_takes_the_arena_limit():
    """The app's first step (``limit_arenas``): glibc accepts M_ARENA_MAX; the burst test in
    test_app_security.py shows what it does to RSS."""
    assert resources.limit_arenas(2)


# ------------------------------------------------------------------------------------ what people read


def test_errors_are_short_path_free_and_logged_once(hub, tmp_path, caplog, monkeypatch):
    bad = tmp_path / "secret-folder"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    m = Models(CPU)
    with caplog.at_level(logging.INFO, logger="webapp"):
        message = _error(m, str(bad), wait=30)
    assert message.startswith(f"Could not load '{bad}': ") and str(tmp_path) not in message.replace(f"'{bad}'", "")
    assert "not valid JSON" in message and len(message) < 400 and "\n" not in message
    assert [r.levelname for r in caplog.records] == ["WARNING"] and caplog.records[0].exc_info is None
    caplog.clear()

    def boom(*args, **kwargs):
        raise RuntimeError(f"internal state at {tmp_path}/x")

    monkeypatch.setattr(vit_core, "from_pretrained", boom)
    with caplog.at_level(logging.INFO, logger="webapp"):
        message = _error(m, str(_checkpoint(tmp_path / "ok")), wait=30)
    assert message == f"Could not load '{tmp_path / 'ok'}': unexpected error (logged on the server)."
    assert ["Traceback" in r.getMessage() for r in caplog.records] == [True, False]  # the traceback, then the request


def test_loader_messages_lose_their_server_paths():
    choice = access.Choice("runs/x", "runs/x", "/srv/app/runs/x", None, "local:/srv/app/runs/x")
    text = models.public_text("/srv/app/runs/x/config.json: not valid JSON (line 1)\n  more", choice)
    assert text == "config.json: not valid JSON (line 1)"
    hub_choice = access.parse("nobody/vit")
    text = models.public_text(
        "nobody/vit: config.json is not in the local cache (/root/.cache/huggingface/hub) and HF_HUB_OFFLINE is set",
        hub_choice,
    )
    assert text == "config.json is not in the local cache (…/hub) and HF_HUB_OFFLINE is set"
    assert "http://127.0.0.1:8/api" in models.public_text("could not reach http://127.0.0.1:8/api", hub_choice)


def test_other_handled_errors_read_well_and_log_one_line(caplog):
    with caplog.at_level(logging.INFO, logger="webapp"):
        e = user_error(ValueError("/tmp/gradio/0a1b/photo.jpg: not an image, or a format Pillow cannot read"))
    assert e.message == "…/photo.jpg: not an image, or a format Pillow cannot read" and not e.print_exception
    assert [r.getMessage() for r in caplog.records] == [
        "ValueError: /tmp/gradio/0a1b/photo.jpg: not an image, or a format Pillow cannot read"
    ]
    already = gr.Error("for people")
    assert user_error(already) is already
    assert public("x" * 500).endswith("…") and len(public("x" * 500)) == 300
    assert public("runs/x: see ./runs/x and ../y") == "runs/x: see ./runs/x and ../y"  # relative paths stay


# ------------------------------------------------------------------------------------ command line


def _options(*argv: str, **env: str) -> Options:
    p = argparse.ArgumentParser()
    p.add_argument("--host")
    p.add_argument("--share", action="store_true")
    options.add_arguments(p)
    old = {k: os.environ.pop(k, None) for k in ("SPACE_ID", "GRADIO_SERVER_NAME")}
    os.environ.update(env)
    try:
        return options.configure(p.parse_args(argv))
    finally:
        for k in ("SPACE_ID", "GRADIO_SERVER_NAME"):
            os.environ.pop(k, None)
            if old[k] is not None:
                os.environ[k] = old[k]


def test_command_line(tmp_path):
    assert _options() == Options(public=False, allow_any=True)
    assert not _options("--host", "0.0.0.0").allow_any and not _options("--share").allow_any
    assert _options("--host", "0.0.0.0", "--allow-any-model").allow_any
    space = _options(SPACE_ID="me/space")
    assert space.public and not space.allow_any
    assert _options("--models", f" bundled, {TI16} ,").models == ("bundled", TI16)
    (tmp_path / "m.yaml").write_text(f"- bundled\n- {B16}\n")
    (tmp_path / "m.json").write_text(json.dumps(["bundled"]))
    assert _options("--models-file", str(tmp_path / "m.yaml")).models == ("bundled", B16)
    assert _options("--models-file", str(tmp_path / "m.json")).models == ("bundled",)
    s = _options("--max-loaded", "2", "--max-loaded-mb", "500", "--max-model-mb", "400", "--failed-load-ttl", "5")
    assert (s.max_loaded, s.max_loaded_mb, s.max_model_mb, s.failed_ttl) == (2, 500, 400, 5.0)
    for argv in (["--public", "--allow-any-model"], ["--models", ","], ["--max-loaded", "0"]):
        with pytest.raises(SystemExit):
            _options(*argv)
    (tmp_path / "bad.yaml").write_text("models: [a]")
    with pytest.raises(SystemExit, match="expected a list"):
        _options("--models-file", str(tmp_path / "bad.yaml"))
