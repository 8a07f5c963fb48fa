"""Publishing to and loading from the Hub, against local servers on 127.0.0.1 (no internet).

``tests/hub_server.py`` implements the Hub endpoints huggingface_hub calls (create repo, preupload,
LFS batch, commit, resolve, model info, tree); olah, a Hub mirror written by others, checks the read path
against a server not written here. huggingface_hub reads its settings at import, so the fixtures below
point its module constants (and, for subprocesses, the environment) at a per-test cache and server.
"""

import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import timm
import torch
from huggingface_hub import ModelCard, constants
from huggingface_hub.utils import _http as hf_http
from PIL import Image

import vit_core
from tests.hub_server import FakeHub, _Handler
from tests.net import free_port
from vit_core import CheckpointError
from vit_core.__main__ import main as cli
from vit_core.calibration import Calibration, predict
from vit_core.calibration.ood import OODDetector, fit_statistics
from vit_core.io.calibration_file import OOD_NAME
from vit_core.io.hub import HubError, push_to_hub
from vit_core.io.model_card import CardFacts, final_metrics, prepare_upload, read_metrics, render_model_card

TOKEN = "hf_aliceWriteToken0123456789abcdef"  # alice's
BOB_TOKEN = "hf_bobReadToken0123456789abcdef"
LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
REPO_ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------ fixtures


def _use_endpoint(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("HF_ENDPOINT", url)  # for subprocesses
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """A huggingface_hub of its own: empty cache, no stored or environment token, online, no xet
    (the servers here speak the classic LFS upload protocol)."""
    home = tmp_path / "hf_home"
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    for var, value in (("HF_HOME", str(home)), ("HF_HUB_DISABLE_XET", "1"), ("HF_HUB_DISABLE_TELEMETRY", "1")):
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return home


@pytest.fixture
def hub(hf_home, monkeypatch):
    server = FakeHub({TOKEN: "alice", BOB_TOKEN: "bob"}).start()
    _use_endpoint(monkeypatch, server.url)
    yield server
    server.stop()


def _model(seed: int = 0, **changes) -> vit_core.VisionTransformer:
    torch.manual_seed(seed)
    cfg = vit_core.ViTConfig(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10, label_names=LABELS
    ).replace(**changes)
    return vit_core.create_model(cfg).eval()


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A small training run folder as the trainer leaves it: checkpoint, metrics, recipe, curves."""
    model = _model().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    rows = []
    for epoch in range(1, 4):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        rows.append({"epoch": epoch, "train_loss": loss.item(), "test_loss": 2 / epoch, "test_top1": 30.0 + epoch})
    run = tmp_path / "run"
    vit_core.save_pretrained(model.eval(), run)
    lines = [json.dumps(r) for r in rows] + [json.dumps({"epoch": 3, "lr": 0.0})]  # last line has no accuracy
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    recipe = {"model": None, "data": "cifar10", "epochs": 3, "lr": 0.01, "hub_token": "hf_leaked"}
    (run / "recipe.json").write_text(json.dumps(recipe))
    fig = plt.figure(figsize=(2, 2))
    fig.gca().plot([r["train_loss"] for r in rows])
    fig.savefig(run / "curves.png")
    plt.close(fig)
    return run


def _logits(model, seed: int = 1) -> torch.Tensor:
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x)


# ------------------------------------------------------------------------------------ push + pull


def _run_usage_snippets(readme: str, num_classes: int) -> None:
    """The card's usage snippets (vit_core's and timm's) run as written, on an image.png in the cwd."""
    snippets = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(snippets) == 2
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save("image.png")
    for code in snippets:
        scope = {}
        exec(compile(code, "README.md", "exec"), scope)
        assert scope["probs"].shape == (1, num_classes)
        assert torch.allclose(scope["probs"].sum(), torch.tensor(1.0))


def test_push_run_then_load_with_vit_core_and_timm(hub, run_dir, tmp_path, monkeypatch, capfd):
    expected = _logits(vit_core.from_pretrained(run_dir))
    url = push_to_hub(run_dir, "alice/cifar-vit", token=TOKEN)
    assert re.fullmatch(rf"{hub.url}/alice/cifar-vit/commit/[0-9a-f]{{40}}", url)

    files = hub.files("alice/cifar-vit")
    assert {"model.safetensors", "config.json", "README.md", "metrics.jsonl", "curves.png"} <= set(files)
    assert files["model.safetensors"] == (run_dir / "model.safetensors").read_bytes()
    assert files["config.json"] == (run_dir / "config.json").read_bytes()
    assert any(m == "PUT" and p.startswith("/lfs/") for m, p in hub.requests)  # weights went through LFS

    ours = vit_core.from_pretrained("alice/cifar-vit")
    assert torch.equal(_logits(ours), expected)
    assert ours.label_names == list(LABELS)
    theirs = timm.create_model("hf-hub:alice/cifar-vit", pretrained=True).eval()
    assert (_logits(theirs) - expected).abs().max().item() <= 1e-5
    assert theirs.pretrained_cfg["mean"] == list(ours.config.mean)

    monkeypatch.chdir(tmp_path)
    _run_usage_snippets(files["README.md"].decode(), num_classes=10)

    out = capfd.readouterr()
    assert TOKEN not in out.out + out.err
    assert not any(TOKEN.encode() in p.read_bytes() for p in run_dir.rglob("*") if p.is_file())


def test_repo_pushed_by_timm_loads_with_the_same_logits(hub):
    torch.manual_seed(7)
    ref = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10).eval()
    timm.models.push_to_hf_hub(ref, "alice/timm-vit", token=TOKEN)  # timm's own uploader and config.json
    ours = vit_core.from_pretrained("alice/timm-vit")
    assert (_logits(ours) - _logits(ref)).abs().max().item() <= 1e-5
    # timm pushes both formats; the pickled one is never fetched when safetensors exist
    assert "pytorch_model.bin" in hub.files("alice/timm-vit")
    assert not any(path.endswith("pytorch_model.bin") for _, path in hub.requests if "/resolve/" in path)


def test_grayscale_average_pooled_model_round_trips_and_its_card_runs(hub, tmp_path, monkeypatch):
    # The MNIST recipe's shape: one channel, no class token, mean of the patch tokens.
    model = _model(seed=8, in_chans=1, mean=(0.1307,), std=(0.3081,), global_pool="avg", class_token=False)
    vit_core.push_to_hub(model, "alice/mnist-vit", token=TOKEN)
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        assert torch.equal(vit_core.from_pretrained("alice/mnist-vit")(x), model(x))
        assert (timm.create_model("hf-hub:alice/mnist-vit", pretrained=True).eval()(x) - model(x)).abs().max() <= 1e-5
    monkeypatch.chdir(tmp_path)
    _run_usage_snippets(hub.files("alice/mnist-vit")["README.md"].decode(), num_classes=10)


def test_private_repo_needs_a_token_with_access(hub, monkeypatch, capfd):
    model = _model(seed=3)
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # the token comes from the environment, as users set it
    vit_core.push_to_hub(model, "alice/private-vit", private=True)
    assert hub.repos["alice/private-vit"].private

    # (before any successful download: once cached, huggingface_hub serves the cached copy)
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(HubError, match="If it is private, set HF_TOKEN"):
        vit_core.from_pretrained("alice/private-vit")
    with pytest.raises(HubError, match="the token in use has no access"):
        vit_core.from_pretrained("alice/private-vit", token=BOB_TOKEN)
    with pytest.raises(HubError, match="needs a Hugging Face token"):
        vit_core.push_to_hub(model, "alice/other")
    with pytest.raises(HubError, match=r"answered 403 \(the token needs write access"):
        vit_core.push_to_hub(model, "alice/private-vit", token=BOB_TOKEN)
    with pytest.raises(HubError, match=r"(?s)Invalid metadata in README.md.*\"license\" must be one of"):
        vit_core.push_to_hub(model, "alice/private-vit", token=TOKEN, license="apache2")

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert torch.equal(_logits(vit_core.from_pretrained("alice/private-vit")), _logits(model))
    out = capfd.readouterr()
    assert TOKEN not in out.out + out.err and BOB_TOKEN not in out.out + out.err


def test_offline_loads_from_cache_without_a_request_and_fails_clearly_when_uncached(hub, monkeypatch):
    model = _model(seed=4)
    push_to_hub(model, "alice/offline-vit", token=TOKEN)
    vit_core.from_pretrained("alice/offline-vit")  # online: fills the cache

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    before = len(hub.requests)
    assert torch.equal(_logits(vit_core.from_pretrained("alice/offline-vit")), _logits(model))
    assert len(hub.requests) == before  # not a single call reached the server
    hub.stop()
    assert torch.equal(_logits(vit_core.from_pretrained("alice/offline-vit")), _logits(model))

    with pytest.raises(HubError, match=r"not in the local cache .* HF_HUB_OFFLINE is set") as e:
        vit_core.from_pretrained("alice/never-downloaded")
    assert "hf download alice/never-downloaded" in str(e.value)


def test_calibration_round_trips_through_the_hub(hub, monkeypatch):
    """A calibrated model pushed and pulled: its temperature, OOD score, threshold and statistics arrive intact
    (``ood.safetensors`` uploaded beside the weights), from the cache offline too; timm still loads the repo."""
    model = _model(seed=9)
    x = torch.randn(40, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        features = model.forward_head(model.forward_features(x), pre_logits=True)
    stats = fit_statistics("mahalanobis", features, torch.arange(40) % 10, 10)
    detector = OODDetector("mahalanobis", 50.0, 0.95, stats, "40 random images")
    model.calibration = Calibration(0.8, "flip", "flip views of 40 random images", detector)
    push_to_hub(model, "alice/calibrated-vit", token=TOKEN)
    files = hub.files("alice/calibrated-vit")
    assert OOD_NAME in files and json.loads(files["config.json"])["calibration"]["temperature"] == 0.8
    card = files["README.md"].decode()
    assert "T = 0.8 for `flip` views" in card and "`mahalanobis` score" in card
    assert "than 95% of the held-out" in card and "above 50" not in card  # the rule in words, not its raw number

    def same(pulled):
        cal = pulled.calibration
        assert (cal.temperature, cal.tta, cal.ood.score, cal.ood.threshold) == (0.8, "flip", "mahalanobis", 50.0)
        assert all(torch.equal(cal.ood.statistics[k], v) for k, v in stats.items())
        a, b = predict(model, x[:4]), predict(pulled, x[:4])
        assert torch.equal(a.probs, b.probs) and torch.equal(a.ood_score, b.ood_score)

    same(vit_core.from_pretrained("alice/calibrated-vit"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    same(vit_core.from_pretrained("alice/calibrated-vit"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    theirs = timm.create_model("hf-hub:alice/calibrated-vit", pretrained=True).eval()
    assert (_logits(theirs) - _logits(model)).abs().max().item() <= 1e-5


def test_server_down_and_uncached_says_so(hf_home, monkeypatch):
    _use_endpoint(monkeypatch, f"http://127.0.0.1:{free_port()}")  # nobody listens there
    # huggingface_hub retries with exponential backoff (about 23 s in all) before giving up: skip the waits
    monkeypatch.setattr(hf_http, "time", types.SimpleNamespace(sleep=lambda seconds: None))
    with pytest.raises(HubError, match="could not reach http://127.0.0.1"):
        vit_core.from_pretrained("alice/anything")


def test_a_client_that_hangs_up_leaves_no_traceback(hub, monkeypatch, capfd):
    """A client gone before its answer is written (the app's loader giving up on a slow repo, an app process a
    test has ended) is normal for a server: the test Hub carries on and prints no BrokenPipeError traceback
    among a passing run's dots (issue #48, item 10)."""
    hub.add_repo("alice/big", {"model.safetensors": bytes(4 * 2**20)})  # more than socket buffers hold: a write fails
    asked, hung_up, done = threading.Event(), threading.Event(), threading.Event()
    dispatch, shutdown_request = _Handler._dispatch, hub.server.shutdown_request

    def answer_after_the_hang_up(handler: _Handler, method: str) -> None:
        asked.set()
        hung_up.wait(10)
        dispatch(handler, method)

    def shutdown_and_tell(request: socket.socket) -> None:  # socketserver's last step, after any handle_error
        shutdown_request(request)
        done.set()

    monkeypatch.setattr(_Handler, "_dispatch", answer_after_the_hang_up)
    monkeypatch.setattr(hub.server, "shutdown_request", shutdown_and_tell)
    with socket.create_connection(hub.server.server_address[:2]) as client:
        client.sendall(b"GET /alice/big/resolve/main/model.safetensors HTTP/1.0\r\n\r\n")
        assert asked.wait(10)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    hung_up.set()
    assert done.wait(10)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err


def test_load_errors_name_the_problem(hub, tmp_path):
    with pytest.raises(CheckpointError, match="no such file or folder, and not a Hub repo id"):
        vit_core.from_pretrained(tmp_path / "missing" / "deeper" / "x.txt")
    with pytest.raises(HubError, match="alice/nope: no such model repo on .* no local file or folder"):
        vit_core.from_pretrained("alice/nope")

    push_to_hub(_model(), "alice/vit", token=TOKEN)
    with pytest.raises(HubError, match="no revision 'v9'"):
        vit_core.from_pretrained("alice/vit", revision="v9")

    hub.add_repo("google/gated-vit", {"config.json": b"{}"}, gated=True)
    with pytest.raises(HubError, match="is gated: accept its conditions"):
        vit_core.from_pretrained("google/gated-vit")

    bert = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 32}
    hub.add_repo("google/bert-tiny", {"config.json": json.dumps(bert).encode(), "model.safetensors": b"x" * 10})
    with pytest.raises(CheckpointError, match="model_type 'bert' is not a Vision Transformer"):
        vit_core.from_pretrained("google/bert-tiny")
    assert ("GET", "/google/bert-tiny/resolve/main/model.safetensors") not in hub.requests  # refused before weights

    resnet = {"architecture": "resnet50", "num_classes": 1000, "pretrained_cfg": {}}
    hub.add_repo("timm/resnet50.a1_in1k", {"config.json": json.dumps(resnet).encode()})
    with pytest.raises(CheckpointError, match="architecture 'resnet50' is not a ViT"):
        vit_core.from_pretrained("hf-hub:timm/resnet50.a1_in1k")

    hub.add_repo("alice/empty", {"notes.txt": b"hello"})
    with pytest.raises(HubError, match=r"no config.json and no .npz file \(files: .gitattributes, notes.txt\)"):
        vit_core.from_pretrained("alice/empty")


def test_oversized_repos_are_refused_before_their_weights_are_downloaded(hub):
    huge = vit_core.io.checkpoint.config_to_dict(_model().config)
    huge["model_args"] |= {"embed_dim": 16384, "depth": 64, "num_heads": 16}
    hub.add_repo("mallory/huge", {"config.json": json.dumps(huge).encode(), "model.safetensors": b"x" * 1024})
    with pytest.raises(CheckpointError, match="parameters, more than the limit"):
        vit_core.from_pretrained("mallory/huge")
    hf = {
        "model_type": "vit",
        "hidden_size": 16384,
        "num_hidden_layers": 64,
        "num_attention_heads": 16,
        "intermediate_size": 65536,
    }
    hub.add_repo("mallory/huge-hf", {"config.json": json.dumps(hf).encode(), "model.safetensors": b"x" * 1024})
    with pytest.raises(CheckpointError, match="parameters, more than the limit"):
        vit_core.from_pretrained("mallory/huge-hf")
    assert not [path for _, path in hub.requests if path.endswith("model.safetensors")]


class _Payload:
    """What a malicious pickle does: call something on load (here, create a file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickled_weights_load_only_as_plain_tensors(hub, tmp_path):
    model = _model(seed=5)
    vit_core.save_pretrained(model, tmp_path / "ckpt")
    config = (tmp_path / "ckpt" / "config.json").read_bytes()
    torch.save({"state_dict": model.state_dict()}, tmp_path / "plain.bin")
    hub.add_repo("alice/bin-vit", {"config.json": config, "pytorch_model.bin": tmp_path / "plain.bin"})
    assert torch.equal(_logits(vit_core.from_pretrained("alice/bin-vit")), _logits(model))

    marker = tmp_path / "code-ran"
    torch.save({**model.state_dict(), "extra": _Payload(marker)}, tmp_path / "evil.bin")
    hub.add_repo("mallory/evil-vit", {"config.json": config, "pytorch_model.bin": tmp_path / "evil.bin"})
    with pytest.raises(CheckpointError, match=r"refused\. Pickled weight files can run arbitrary code"):
        vit_core.from_pretrained("mallory/evil-vit")
    assert not marker.exists()


def test_npz_in_a_hub_repo_loads_by_listing_or_by_name(hub, tmp_path):
    from tests.test_convert import _jax_arrays

    model = _model(seed=6, label_names=None)
    np.savez(tmp_path / "ViT-tiny.npz", **_jax_arrays(model.state_dict(), num_heads=2))
    hub.add_repo("google/vit-npz", {"ViT-tiny.npz": tmp_path / "ViT-tiny.npz"})
    for name in ("google/vit-npz", "google/vit-npz/ViT-tiny.npz"):
        assert torch.allclose(_logits(vit_core.from_pretrained(name)), _logits(model), atol=1e-6)
    assert ("GET", "/api/models/google/vit-npz/tree/main") in hub.requests  # listed with the tree endpoint


def test_transformers_repo_on_the_hub_loads(hub, tmp_path):
    transformers = pytest.importorskip("transformers")
    from tests.test_convert import _randomize

    cfg = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8
    )
    ref = transformers.ViTForImageClassification(cfg).eval()
    _randomize(ref)
    ref.save_pretrained(tmp_path / "hf")
    processor = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 2}
    (tmp_path / "hf" / "preprocessor_config.json").write_text(json.dumps(processor))
    hub.add_repo("google/vit-tiny", {p.name: p for p in (tmp_path / "hf").iterdir()})

    ours = vit_core.from_pretrained("google/vit-tiny")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(x) - ref(pixel_values=x).logits).abs().max().item() <= 1e-4
    assert ours.config.mean == (0.485, 0.456, 0.406) and ours.config.interpolation == "bilinear"


# ------------------------------------------------------------------------------------ command line


def test_cli_push_uploads_and_never_prints_the_token(hub, run_dir, capsys):
    env = {**os.environ, "PUSH_TOKEN": TOKEN, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "vit_core", "push", str(run_dir), "alice/cli-vit", "--token-env", "PUSH_TOKEN"]
    done = subprocess.run([*cmd, "--private", "--message", "first"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"{hub.url}/alice/cli-vit/commit/" in done.stdout
    assert TOKEN not in done.stdout + done.stderr
    assert hub.repos["alice/cli-vit"].private and "README.md" in hub.files("alice/cli-vit")

    assert cli(cmd[3:]) == 1  # in-process, without the variable set
    assert "error: pushing needs a Hugging Face token" in capsys.readouterr().err


def test_cli_dry_run_prints_the_card_and_uploads_nothing(hub, run_dir, capsys):
    assert cli(["push", str(run_dir), "alice/dry", "--dry-run"]) == 0
    out = capsys.readouterr()
    assert ModelCard(out.out).data.library_name == "timm"
    assert "would upload: README.md, model.safetensors, config.json, metrics.jsonl, curves.png" in out.err
    assert hub.requests == []
    assert cli(["push", str(run_dir.parent / "nowhere"), "alice/dry", "--dry-run"]) == 1
    assert "push a folder written by save_pretrained" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ model card


def test_model_card_of_a_conv_stem_hybrid_does_not_promise_timm(tmp_path):
    """timm has no conv-stem ViT: loading such a checkpoint in timm fails, so its card names vit_core as the
    library, drops the timm tag and usage, and says why; a plain ViT's card keeps them."""
    model = _model(patch_size=1, stem_channels=(16, 32), stem_strides=(2, 2))
    vit_core.save_pretrained(model, tmp_path / "hybrid")
    with pytest.raises((AttributeError, RuntimeError)):  # the independent check: timm cannot build or fill it
        timm.create_model(f"local-dir:{tmp_path / 'hybrid'}", pretrained=True)
    _, text = prepare_upload(tmp_path / "hybrid", "alice/conv-hybrid")
    data = ModelCard(text).data
    assert data.library_name == "vit_core" and "timm" not in data.tags
    assert "hf-hub:alice/conv-hybrid" not in text and "timm has no conv-stem ViT" in text
    assert "conv stem of widths [16, 32]" in text and "a token per 4x4 pixels" in text
    vit_core.save_pretrained(_model(), tmp_path / "plain")
    timm.create_model(f"local-dir:{tmp_path / 'plain'}", pretrained=True)  # loads
    _, text = prepare_upload(tmp_path / "plain", "alice/plain")
    assert ModelCard(text).data.library_name == "timm" and "hf-hub:alice/plain" in text


def test_model_card_metadata_validates_and_carries_the_run(run_dir):
    files, text = prepare_upload(run_dir, "alice/cifar-vit")
    card = ModelCard(text)  # parses the YAML front matter and its model-index
    data = card.data
    assert data.library_name == "timm" and data.license == "apache-2.0"
    assert data.pipeline_tag == "image-classification"
    assert {"image-classification", "vit_core", "timm", "vision-transformer"} <= set(data.tags)
    assert data.datasets == ["uoft-cs/cifar10"]
    (result,) = data.eval_results
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert result.metric_type == "accuracy" and result.dataset_split == "test"
    assert result.metric_value == rows[2]["test_top1"] == 33.0  # the last line reporting accuracy
    assert "| top-1 accuracy on the evaluation images | 33% |" in card.text and "| epochs trained | 3 |" in card.text
    assert ", ".join(f"`{i}` {n}" for i, n in enumerate(LABELS)) in card.text
    assert '"epochs": 3' in card.text and "hf_leaked" not in text  # recipe shown, credentials dropped
    assert "![curves](curves.png)" in card.text
    assert 'vit_core.from_pretrained("alice/cifar-vit")' in card.text
    assert 'timm.create_model("hf-hub:alice/cifar-vit", pretrained=True)' in card.text
    assert set(files) == {"model.safetensors", "config.json", "metrics.jsonl", "curves.png"}


@pytest.mark.parametrize(
    "recipe, datasets, eval_dataset",
    [
        ({"data": "hf:alice/birds"}, ["alice/birds"], "alice/birds"),
        ({"data": "/data/my_photos"}, None, "my_photos"),  # a local folder: named, not linked
        ({"data": "mnist", "task": "mpp"}, ["ylecun/mnist"], None),  # pre-training: no classification accuracy
    ],
)
def test_model_card_dataset_and_task_from_the_recipe(recipe, datasets, eval_dataset):
    cfg = _model().config
    facts = CardFacts(metrics=[{"epoch": 1, "test_acc": 0.5}], recipe=(recipe, "json"))
    text = render_model_card(cfg, "alice/x", facts)
    data = ModelCard(text).data
    assert data.datasets == datasets
    assert (data.eval_results[0].dataset_type if data.eval_results else None) == eval_dataset
    assert ("| accuracy on the evaluation images | 0.5 |" in text) == (eval_dataset is not None)
    assert "/data" not in text  # a folder by its name


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([{"epoch": 1, "top1": 71.5}, {"epoch": 2, "top1": 80.25, "top5": 95.0}], ("top1", 80.25)),
        ([{"val_acc": 0.5}, {"val_acc": 0.75}, {"note": "done"}], ("val_acc", 0.75)),
        ([{"test_top1": 80.0, "ema_test_top1": 81.0}], ("ema_test_top1", 81.0)),  # EMA weights are exported
        ([{"train_loss": 1.0}], None),
    ],
)
def test_final_metrics_reads_the_last_accuracy(rows, expected):
    found = final_metrics(rows)
    if expected is None:
        assert found is None
    else:
        key, row = found
        assert (key, row[key]) == expected


# ------------------------------------------------------------------------------------ olah


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_pull_through_olah_mirror_serving_a_local_repo_offline(hf_home, run_dir, tmp_path, monkeypatch):
    pytest.importorskip("olah", reason="olah (a Hub mirror) is a test requirement (requirements-dev.txt)")
    if shutil.which("git") is None:
        pytest.skip("olah serves local repos from git; no git executable on PATH")
    # The repo as git + git-lfs store it: model.safetensors is a pointer file, its bytes under .git/lfs/objects.
    repo = tmp_path / "mirrors" / "models" / "alice" / "olah-vit"
    repo.mkdir(parents=True)
    _git("init", "-q", "-b", "main", ".", cwd=repo)
    files, card = prepare_upload(run_dir, "alice/olah-vit")
    (repo / "README.md").write_text(card)
    (repo / "config.json").write_bytes(files["config.json"].read_bytes())
    weights = files["model.safetensors"].read_bytes()
    oid = hashlib.sha256(weights).hexdigest()
    lfs_object = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    lfs_object.parent.mkdir(parents=True)
    lfs_object.write_bytes(weights)
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(weights)}\n"
    (repo / "model.safetensors").write_text(pointer)
    _git("add", ".", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "add model", cwd=repo)

    port = free_port()
    config = tmp_path / "olah.toml"
    config.write_text(
        f'[basic]\nhost = "127.0.0.1"\nport = {port}\nrepos-path = "{tmp_path / "olah-cache"}"\n'
        f'mirrors-path = ["{tmp_path / "mirrors"}"]\n\n[accessibility]\noffline = true\n'
    )
    log = (tmp_path / "olah.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-c", "from olah.server import cli; cli()", "-c", str(config), "--log-path", str(tmp_path)],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "olah.log").read_text()
                assert time.monotonic() < deadline, "olah did not start in 60 s"
                time.sleep(0.2)
        _use_endpoint(monkeypatch, f"http://127.0.0.1:{port}")
        expected = _logits(vit_core.from_pretrained(run_dir))
        assert torch.equal(_logits(vit_core.from_pretrained("alice/olah-vit")), expected)
        theirs = timm.create_model("hf-hub:alice/olah-vit", pretrained=True).eval()
        assert (_logits(theirs) - expected).abs().max().item() <= 1e-5
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_push_offline_or_to_a_dead_hub_says_what_happened(hf_home, monkeypatch):
    """Issue 66: a push while HF_HUB_OFFLINE is set, or to a Hub nobody answers at, is a ``HubError`` sentence
    (huggingface_hub's ``OfflineModeIsEnabled`` and httpx's connection errors escaped before: the app's page got
    ``{"error": null}`` and the log a traceback)."""
    model = _model()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match=r"could not push to alice/x: HF_HUB_OFFLINE is set"):
        push_to_hub(model, "alice/x", token=TOKEN)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    _use_endpoint(monkeypatch, f"http://127.0.0.1:{free_port()}")  # nobody listens there
    monkeypatch.setattr(hf_http, "time", types.SimpleNamespace(sleep=lambda seconds: None))
    with pytest.raises(HubError, match=r"could not push to alice/x: the Hub at http://127.0.0.1:\d+ could not be"):
        push_to_hub(model, "alice/x", token=TOKEN)
