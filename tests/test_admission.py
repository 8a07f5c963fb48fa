"""The app's admission: the memory budget read from the cgroup, the gate that admits, queues or refuses by
estimated memory, the estimate's parts, and every compute listener in one concurrency group. The estimate
against measured peaks of real requests, per-client limits and upload limits are in ``tests/test_app.py``
(a running server)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import vit_core
from vit_core import methods
from vit_core.data import ImageHeader, build_transform
from webapp import admission, analysis, archives, estimates
from webapp.admission import MB, Busy, Gate, rss
from webapp.catalog import BUNDLED
from webapp.settings import PREDICTED
from webapp.tabs import batch, classify
from webapp.tabs import inspect as inspect_tab
from webapp.ui import fresh

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_budget_comes_from_the_containers_limit(tmp_path):
    """cgroup v2 (``memory.max``, "max" when unlimited) and v1 (``memory.limit_in_bytes``, a huge number when
    unlimited); a limit on an ancestor applies too; none found: None (then the machine's memory)."""
    v2 = tmp_path / "v2"
    _write(v2 / "proc", "0::/app/worker\n")
    _write(v2 / "fs" / "memory.max", "max\n")
    _write(v2 / "fs" / "app" / "memory.max", f"{5 << 30}\n")
    _write(v2 / "fs" / "app" / "worker" / "memory.max", "max\n")
    assert admission.container_memory_limit(v2 / "proc", v2 / "fs") == 5 << 30
    v1 = tmp_path / "v1"
    _write(v1 / "proc", "12:pids:/x\n4:memory:/process_api/abc\n0::/\n")
    _write(v1 / "fs" / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    _write(v1 / "fs" / "memory" / "process_api" / "abc" / "memory.limit_in_bytes", "9223372036854771712\n")
    assert admission.container_memory_limit(v1 / "proc", v1 / "fs") is None  # unlimited, as this machine says
    _write(v1 / "fs" / "memory" / "process_api" / "memory.limit_in_bytes", f"{3 << 30}\n")
    assert admission.container_memory_limit(v1 / "proc", v1 / "fs") == 3 << 30
    assert admission.container_memory_limit(tmp_path / "missing", tmp_path) is None
    physical = admission.os.sysconf("SC_PAGE_SIZE") * admission.os.sysconf("SC_PHYS_PAGES")
    expected = admission.container_memory_limit() or physical
    assert admission.default_max_memory() == int(admission.DEFAULT_SHARE * expected)


def test_the_gate_admits_what_fits_queues_what_will_fit_and_refuses_the_rest():
    gate = Gate(max_memory=rss() + 300 * MB, max_wait=30)
    too_large = r"needs about 400 MB of memory, more than this server has for one request"
    with pytest.raises(Busy, match=too_large), gate.held(400 * MB):
        pass
    order, held = [], threading.Event()

    def first():
        with gate.held(200 * MB):
            held.set()
            time.sleep(0.5)
            order.append("first done")

    def second():
        held.wait()
        with gate.held(200 * MB):  # 200 + 200 > 300: waits for the first
            order.append("second admitted")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order == ["first done", "second admitted"]
    with gate.held(100 * MB), gate.held(100 * MB):  # both fit at once
        pass

    impatient = Gate(max_memory=rss() + 300 * MB, max_wait=0.2)
    holding, release = threading.Event(), threading.Event()

    def hold():
        with impatient.held(250 * MB):
            holding.set()
            release.wait()

    t = threading.Thread(target=hold)
    t.start()
    holding.wait()
    try:
        with pytest.raises(Busy, match=r"The server is busy; try again in \d+ s"), impatient.held(100 * MB):
            pass
    finally:
        release.set()
        t.join()
    with impatient.held(100 * MB):  # free again
        pass


def test_a_gated_listener_keeps_its_signature_and_its_cost_sees_its_arguments():
    seen = {}

    def listener(image: str | None, model_choice: str = "m", progress=None) -> str:
        return f"{image}-{model_choice}"

    def cost(arguments: dict) -> int:
        seen.update(arguments)
        return MB

    gated = Gate(max_memory=rss() + 100 * MB).admit(listener, cost)
    assert inspect.signature(gated) == inspect.signature(listener)  # Gradio reads progress and events from it
    assert gated("a.png", model_choice="x") == "a.png-x" and seen == {"image": "a.png", "model_choice": "x"}


def estimating(model: object, transform: object = None, device: torch.device = CPU) -> SimpleNamespace:
    """What a tab's estimate reads of the app's context: the loaded model of the choice "bundled" (none of any
    other), the device and the default map."""
    loaded = lambda choice: (model, transform) if choice == "bundled" else None  # noqa: E731
    return SimpleNamespace(models=SimpleNamespace(loaded=loaded), device=device, default_method=methods.ATTNLRP)


def test_the_estimate_follows_the_image_the_model_and_the_tab():
    model = vit_core.from_pretrained(BUNDLED).eval()
    tf = build_transform(model.pretrained_cfg)
    ctx = estimating(model, tf)
    big, small = ImageHeader((7063, 7063), "PNG", "RGB"), ImageHeader((451, 300), "JPEG", "RGB")
    need = analysis.needed_side(tf)
    # decoding a 49.9 MP PNG dominates: its full decode (4 bytes a pixel) and the reduced copies
    assert estimates.image_bytes(big, tf, classify.DRAW_BYTES) == big.decode_bytes(analysis.MAX_SIDE, need)
    assert big.decode_bytes(analysis.MAX_SIDE, need) == 4 * 7063 * 7063 + 28 * 2048 * 2048
    # a small photo: what follows the decode, the picture drawn and the model
    assert estimates.image_bytes(small, tf, classify.DRAW_BYTES, 5 * MB) == (4 + 36) * 451 * 300 + 5 * MB
    # a request about a real upload: its bytes (read once), then the decode or what follows it
    photo = ROOT / "examples" / "cat_chelsea.jpg"
    header = vit_core.data.read_header(photo)
    cfg = model.config
    work = estimates.analysis_bytes(cfg) + estimates.map_bytes(cfg, methods.ATTNLRP)  # the default map
    expected = estimates.REQUEST_BYTES + photo.stat().st_size + estimates.image_bytes(header, tf, 36, work)
    assert classify.estimate(ctx, {"image": str(photo), "model_choice": "bundled"}) == expected
    # a RISE map costs 64 masked images through the model; raw attention none beyond the analysis
    rise, raw = (
        classify.estimate(ctx, {"model_choice": "bundled", "method": m.title}) for m in (methods.RISE, methods.RAW)
    )
    assert rise - raw == estimates.forward_bytes(cfg, 64, attention=False) + 4 * 500 * 32 * 32
    gpu = estimating(model, tf, torch.device("cuda"))  # the model's memory is the GPU's
    assert classify.estimate(gpu, {"model_choice": "bundled", "method": methods.RISE.title}) == estimates.REQUEST_BYTES
    b16 = vit_core.get_config("vit_base_patch16_224")
    assert estimates.forward_bytes(b16, 1) == vit_core.models.cost.activation_bytes(b16)
    # a batch: its decoding bounded by batch.MAX_DECODE_BYTES whatever it holds, the gallery, and one chunk:
    # gradient rollout runs 4 images per backward pass, rollout 16 per forward pass
    gallery = archives.MAX_IMAGES * 4 * batch.THUMB * batch.THUMB
    base = estimates.REQUEST_BYTES + batch.MAX_DECODE_BYTES + gallery
    vit_b = estimating(SimpleNamespace(config=b16))
    for method, chunk in ((methods.GRADIENT, 6 * 4), (methods.ROLLOUT, 2 * 16)):
        want = base + chunk * estimates.forward_bytes(b16, 1)
        assert batch.estimate(vit_b, {"model_choice": "bundled", "method": method.title}) == want
    # a model that is not loaded: the request fails at once and costs little
    assert estimates.request_only(ctx, {}) == inspect_tab.estimate(ctx, {"model_choice": "other"})
    assert inspect_tab.estimate(ctx, {"model_choice": "other"}) == estimates.REQUEST_BYTES


def test_every_compute_listener_is_gated_and_in_one_concurrency_group():
    """The API's listeners pass the gate before they run; the page's hold it inside ``fresh.answer`` (after their
    ticket: see ``tests/test_webapp.py``), which every page request must pass it to: here Classify's, refused for
    memory, says so in place of its results."""
    import app

    ctx = app.setup("bundled")
    ctx.gate = Gate()
    demo = app.build_ui(ctx)
    compute = {fn.api_name: fn for fn in demo.fns.values() if fn.concurrency_id == admission.COMPUTE}
    api = {"classify", "explore", "compare", "batch", "inspect"}  # each tab's endpoint, and the page's events:
    page = {"classify_page", "classify_new", "explore_picture", "explore_point", "explore_clicked", "explore_page"}
    page |= {"compare_page", "batch_page", "batch_new", "inspect_page"}
    assert sorted(compute) == sorted(api | page)
    # every other queued event is the picker's (gated, outside the group: a choice, and the page's load, which
    # marks the models that cannot load now) or the Train tab's (its job holds the gate while its process trains,
    # for minutes: a compute slot would stop Classify); the rest clear outputs
    others = [fn for fn in demo.fns.values() if fn.concurrency_id != admission.COMPUTE and fn.queue is not False]
    allowed = ("on_change", "on_load", "train", "cancel", "push")
    assert others and all(fn.name in allowed for fn in others), [fn.name for fn in others]
    gated = {fn.api_name or fn.name for fn in demo.fns.values() if getattr(fn.fn, "__wrapped__", None) is not None}
    assert gated >= api | {"on_change", "on_load"} and not gated & page
    assert "held" in inspect.signature(fresh.answer).parameters  # required: no page request without the gate

    ctx.gate = Gate(max_memory=1)  # nothing fits
    image = str(ROOT / "examples" / "cat_chelsea.jpg")
    show = compute["classify_page"].fn
    labels, overlay, _, verdict, _ = show(
        image, "bundled", "AttnLRP", PREDICTED, 1, "mean", "mean", 0.0, 0.5, 5, None, request=None
    )
    assert verdict["value"].startswith("⚠️ This request needs about ") and labels is None and overlay is None


def test_the_limits_are_options_of_the_app():
    out = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    for option in ("--max-memory MB", "--max-wait", "--max-file-mb", "--per-client", "--concurrency"):
        assert option in out.stdout
    assert "80% of the container's limit" in " ".join(out.stdout.split())
