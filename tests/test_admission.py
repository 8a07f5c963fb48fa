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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

import vit_core
from vit_core import methods
from vit_core.data import ImageHeader, build_transform
from webapp.inference import analysis, archives, estimates
from webapp.inference.settings import MapSettings
from webapp.registry.catalog import BUNDLED
from webapp.server import admission
from webapp.server.admission import MB, Busy, Gate, rss
from webapp.tabs import batch, classify
from webapp.tabs import inspect as inspect_tab
from webapp.ui import events
from webapp.ui.declarations import Tab
from webapp.ui.endpoints import Context, Prepared, api

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


def test_a_gated_function_keeps_its_signature_and_its_estimate_and_computation_share_one_request():
    """``Context.admitted``: Gradio reads the function's parameters (after ``ctx``); the request is prepared once,
    and the estimate and the computation get that one ``Prepared`` (its choice resolved once, its upload opened
    once). A listener of its own (the picker's) keeps its signature and gets its arguments."""
    seen: list[tuple[str, Prepared]] = []

    def _compute(ctx: Context, request: Prepared) -> str:
        seen.append(("compute", request))
        return f"{request['image']}-{request['model_choice']}"

    def estimate(ctx: Context, request: Prepared) -> int:
        seen.append(("estimate", request))
        return MB

    ctx = Context(SimpleNamespace(), gate=Gate(max_memory=rss() + 100 * MB), trainer=SimpleNamespace())
    public = api(_compute, ("image", "model_choice"))
    gated = ctx.admitted(public, estimate)
    assert list(inspect.signature(gated).parameters) == ["image", "model_choice"]  # what Gradio reads
    assert gated("a.png", model_choice="x") == "a.png-x"
    assert [what for what, _ in seen] == ["estimate", "compute"] and seen[0][1] is seen[1][1]
    assert dict(seen[0][1].values) == {"image": "a.png", "model_choice": "x"}

    def listener(choice: str, kept: dict | None, progress=None) -> str:
        return f"{choice}-{kept}"

    gated = ctx.admitted(listener, estimates.request_only, gpu=False)
    assert inspect.signature(gated) == inspect.signature(listener)  # Gradio reads progress and events from it
    assert gated("m", kept={"a": 1}) == "m-{'a': 1}"


def estimating(model: object, transform: object = None, device: torch.device = CPU) -> SimpleNamespace:
    """What a tab's estimate reads of the app's context: the loaded model of the choice "bundled" (none of any
    other), the device and the default map."""

    def loaded(request: Prepared) -> tuple:
        return (model, transform) if request.values.get("model_choice") == "bundled" else (None, None)

    return SimpleNamespace(loaded=loaded, device=device, default_method=methods.ATTNLRP)


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
    # a request about a real upload: its bytes (read once), then, this photo's decode being the smaller part, the
    # reduced image (4 bytes a pixel) and Classify's pictures (36) beside the model
    photo = ROOT / "examples" / "cat_chelsea.jpg"
    cfg = model.config
    raw = {"model_choice": "bundled", "method": methods.RAW.title}
    with_photo, without = (
        classify.estimate(ctx, Prepared({**raw, "image": str(photo)})),
        classify.estimate(ctx, Prepared(raw)),
    )
    assert with_photo - without == photo.stat().st_size + (4 + 36) * 451 * 300
    # no method: the server's default map, AttnLRP here, whose backward pass keeps 6 forward passes' activations
    default = classify.estimate(ctx, Prepared({"image": str(photo), "model_choice": "bundled"}))
    assert default - with_photo == 6 * vit_core.models.cost.activation_bytes(cfg)
    # a RISE map costs 64 masked images through the model; raw attention none beyond the analysis
    rise, raw = (
        classify.estimate(ctx, Prepared({"model_choice": "bundled", "method": m.title}))
        for m in (methods.RISE, methods.RAW)
    )
    assert rise - raw == estimates.forward_bytes(cfg, 64, attention=False) + 4 * 500 * 32 * 32
    gpu = estimating(model, tf, torch.device("cuda"))  # the model's memory is the GPU's
    assert (
        classify.estimate(gpu, Prepared({"model_choice": "bundled", "method": methods.RISE.title}))
        == estimates.REQUEST_BYTES
    )
    b16 = vit_core.get_config("vit_base_patch16_224")  # 12 layers of 12 heads, 197 tokens, 768 wide, MLP 3072
    # by hand, as the estimate's docstring states it: the image (3 x 224 x 224), every block's probabilities
    # (12 x 12 x 197^2) and one block's widest intermediates (197 x (5 x 768 + 2 x 3072) + 2 x 12 x 197^2), 4 bytes
    b16_pass = 4 * (3 * 224 * 224 + 144 * 197 * 197 + 197 * (5 * 768 + 2 * 3072) + 2 * 12 * 197 * 197)
    assert b16_pass == 34_549_152 == estimates.forward_bytes(b16, 1)
    assert b16_pass - estimates.forward_bytes(b16, 1, attention=False) == 4 * 144 * 197 * 197
    # a batch: its decoding bounded by batch.MAX_DECODE_BYTES whatever it holds, the gallery, and one chunk:
    # gradient rollout runs 4 images per backward pass, rollout 16 per forward pass
    gallery = archives.MAX_IMAGES * 4 * batch.THUMB * batch.THUMB
    base = estimates.REQUEST_BYTES + batch.MAX_DECODE_BYTES + gallery
    vit_b = estimating(SimpleNamespace(config=b16))
    for method, chunk in ((methods.GRADIENT, 6 * 4), (methods.ROLLOUT, 2 * 16)):
        want = base + chunk * b16_pass
        assert batch.estimate(vit_b, Prepared({"model_choice": "bundled", "method": method.title})) == want
    # a model that is not loaded: the request fails at once and costs little, whatever it asks
    rise = {"model_choice": "other", "method": methods.RISE.title}
    assert (
        classify.estimate(ctx, Prepared(rise))
        == inspect_tab.estimate(ctx, Prepared(rise))
        == estimates.REQUEST_BYTES
        == 48 * MB
    )
    assert inspect_tab.estimate(ctx, Prepared({"model_choice": "bundled"})) > estimates.REQUEST_BYTES


class Counting(Gate):
    """A gate that admits nothing and counts the requests that asked it."""

    def __init__(self) -> None:
        super().__init__(max_memory=1)
        self.asked = 0

    @contextmanager
    def held(self, cost: int) -> Iterator[None]:
        self.asked += 1
        with super().held(cost):
            yield


def _declared(monkeypatch) -> tuple[Context, gr.Blocks, list[Tab]]:
    """The app's page, and what each of its tabs declared (``app.TABS``, as ``app.build_ui`` wires them)."""
    import app

    declared: list[Tab] = []

    def recording(ctx: Context, tab: Tab) -> None:
        declared.append(tab)
        events.wire(ctx, tab)

    monkeypatch.setattr(app, "wire", recording)
    ctx = app.setup("bundled")
    ctx.gate = Counting()
    demo = app.build_ui(ctx)
    assert len(declared) == len(app.TABS) == 6
    return ctx, demo, declared


def _page_arguments(fn: gr.blocks.BlockFunction) -> dict:
    """Values for every input of a page event: the example photo, the bundled model, a point, and each setting
    at its API default."""
    photo = str(ROOT / "examples" / "cat_chelsea.jpg")
    values = {"image": analysis.Upload(photo), "files": [photo], "model_choice": "bundled", "x": 200.0, "y": 150.0}
    values |= {name: getattr(MapSettings, name) for name in MapSettings.names()}
    names = inspect.signature(fn.fn).parameters
    return {n: values.get(n) for n in names if n not in ("request", "progress", "event")}


def test_every_compute_listener_is_gated_and_in_one_concurrency_group(monkeypatch):
    """Every endpoint a tab declares computing (its API) and every page event it declares is in the compute group;
    the API's listeners pass the gate before they run, the page's hold it inside ``events.if_newest`` (after their
    ticket: see ``tests/test_webapp.py``): here every one asks a gate that admits nothing, and Classify's page
    request says so in place of its results."""
    ctx, demo, declared = _declared(monkeypatch)
    compute = {fn.api_name: fn for fn in demo.fns.values() if fn.concurrency_id == admission.COMPUTE}
    api = {a.name for tab in declared for a in tab.apis if a.compute}
    page = {e.name for tab in declared for e in tab.events}
    assert api and page and sorted(compute) == sorted(api | page)
    # every other queued event is the picker's (gated, outside the group: a choice, and the page's load, which
    # marks the models that cannot load now) or one the Train tab declares outside it (its job holds the gate
    # while its process trains, for minutes: a compute slot would stop Classify); the rest clear outputs
    own = {a.name for tab in declared for a in tab.apis if not a.compute} | {"on_change", "on_load"}
    others = {fn.api_name for fn in demo.fns.values() if fn.concurrency_id != admission.COMPUTE and fn.queue}
    assert others == own
    for name in sorted(api):  # refused before they run
        with pytest.raises(Busy):
            compute[name].fn(**_page_arguments(compute[name]))
    assert ctx.gate.asked == len(api)
    for name in sorted(page):
        fn, asked = compute[name], ctx.gate.asked
        event = SimpleNamespace(index=(100, 100))  # a click, for the events that take one
        extra = {"event": event} if "event" in inspect.signature(fn.fn).parameters else {}
        out = fn.fn(**_page_arguments(fn), request=None, **extra)
        if inspect.isgenerator(out):  # an answer in parts (Classify's): its first asks the gate
            list(out)
        assert ctx.gate.asked == asked + 1, name

    ((labels, overlay, _, verdict, _),) = compute["classify_page"].fn(
        **_page_arguments(compute["classify_page"]), request=None
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
