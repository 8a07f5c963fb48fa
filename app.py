"""Gradio app: classify an image and see where the Vision Transformer looked.

    python app.py [--model PATH_OR_REPO] [--device auto|cpu|cuda] [--host 127.0.0.1] [--port 7860] [--share]
    python app.py --public [--models a,b]     # a public server: all interfaces (unless --host), listed models only

Runs locally (GPU when there is one), and unchanged as a Hugging Face Space (ZeroGPU included). All model,
image and explanation logic lives in ``vit_core`` and ``webapp``, each tab in a module of ``webapp/tabs``; this file
is the page (the picker, then ``TABS``), the launch and the events.

Endpoints (``gradio_client``): ``/classify``, ``/explore`` (one patch's attention), ``/compare`` (every method
with its deletion/insertion AUC), ``/batch`` (many images or a zip -> gallery + CSV), ``/inspect`` and ``/train``
(fine-tune the chosen model on a zip of labelled photos, progress streamed; the new model's value comes last).
"""

from __future__ import annotations

# ZeroGPU Spaces need `spaces` imported before anything touches CUDA; elsewhere it is absent.
try:
    import spaces
except ImportError:
    spaces = None

import argparse
import socket

import gradio as gr
import torch
from fastapi.middleware import Middleware

from webapp.inference.archives import MAX_TOTAL_BYTES
from webapp.registry.models import Models
from webapp.registry.options import ALL_INTERFACES, Options, add_arguments, configure, serving_host
from webapp.resources import limit_arenas
from webapp.server import gradio_patches, payloads, tempfiles
from webapp.server.admission import DEFAULT_SHARE, MB, Gate
from webapp.server.bodies import MAX_JSON_BYTES, BodyLimits
from webapp.server.newcomers import RequestScope, SessionRate
from webapp.server.queueing import MAX_PER_ADDRESS, ClientLimits, Connections, OwnCancels, UploadLimits
from webapp.server.sessions import Sessions
from webapp.tabs import batch, classify, compare, explore, inspect, train
from webapp.ui import picker
from webapp.ui.controls import Controls
from webapp.ui.declarations import Page
from webapp.ui.endpoints import Context
from webapp.ui.events import wire

TABS = (classify, explore, compare, batch, inspect, train)  # the page's tabs, in order: each a module (``webapp.tabs``)
QUEUE_SIZE = 64  # requests waiting at once, all clients together
DELETE_CACHE = (300, 900)  # every 5 minutes, delete uploads and outputs older than 15 minutes
CSS = """
.verdict p { font-size: 1.6rem; font-weight: 600; margin: 0; }
.verdict.quiet p { font-size: 1.05rem; font-weight: 500; }
.notice p { font-size: 0.8rem; opacity: 0.8; margin: 0; }
/* what the methods and figures are, one line each: small, the names no larger than the words */
.legend :is(p, li, strong) { font-size: 0.8rem; line-height: 1.35; margin: 0; }
.legend ul { margin: 0; padding-left: 1.1em; }
.verdict p + p { font-size: 1rem; font-weight: 400; margin-top: 0.3rem; }
/* the class bars of an image the model calls none of its classes: there, not the answer */
.greyed { filter: grayscale(1); opacity: 0.55; }
#summary table, #train-result table { word-break: normal; overflow-wrap: normal; hyphens: none; }
#summary td:first-child { white-space: nowrap; }
:is(#summary, #train-result) .prose { overflow-x: auto; }
/* galleries: every tile shown whole (no scroll box cutting the last row), each caption under its picture, in full */
.tiles .grid-wrap { height: auto !important; max-height: none !important; overflow: visible !important; }
.tiles, .tiles .gallery-container { height: auto !important; }
.tiles .grid-container { grid-auto-rows: auto !important; height: auto !important; align-items: start; }
.tiles .thumbnail-item { aspect-ratio: auto !important; height: auto !important; display: flex;
                         flex-direction: column; }
.tiles .thumbnail-item img { height: auto !important; }
.tiles .caption-label { position: static !important; max-width: none !important; white-space: normal !important;
                        overflow: visible !important; text-overflow: clip !important; transform: none !important;
                        margin: 4px 0 0 0 !important; text-align: left; overflow-wrap: anywhere; }
#compare-gallery .caption-label { display: none; }  /* each map's picture carries its title and scores */
/* figures: their buttons (full screen, download) in a row above the picture, not over it */
.figure .image-container { display: flex; flex-direction: column; }
.figure .icon-button-wrapper.top-panel { position: static !important; align-self: flex-end; margin: 0 0 2px 0; }
.figure .image-container > button { flex: 1 1 auto; min-height: 0; }
.tiles .grid-wrap > .icon-button-wrapper { position: static !important; justify-content: flex-end; margin-bottom: 2px; }
/* labels above their component, never over a figure */
:is(.tiles, #labels) label[data-testid="block-label"] { position: static !important; margin-bottom: 4px; }
/* "Use via API" on phones too (Gradio hides it under 640 px). Outside the media query: Gradio scopes the rules in
   one to the page's content, which the footer is not part of; on wider screens these are Gradio's own values. */
footer .show-api { display: flex !important; }
footer .show-api-divider { display: block !important; }
@media (max-width: 640px) {
  .tab-wrapper button[role="tab"] { padding: 0 5px; }  /* the six tabs in one row at 390 px */
  .phone-2-columns .grid-container { --grid-cols: 2 !important; }
  /* the scores table: Gradio fixes each column to its unwrapped width; on phones let whole words wrap instead */
  #compare-table table { width: 100% !important; }
  #compare-table :is(th, td) { width: auto !important; min-width: 0 !important; max-width: none !important;
                               white-space: normal !important; word-break: normal; overflow-wrap: normal; }
}
"""


def build_ui(ctx: Context) -> gr.Blocks:
    """The page: the model picker and the shared image controls, then a tab for each module of ``TABS``, each
    wired from what it declares (``webapp.ui.events``), starting on the startup model."""
    with gr.Blocks(title="Vision Transformer: where did it look?", delete_cache=DELETE_CACHE) as demo:
        gr.Markdown(
            "## Where did the Vision Transformer look?\n"
            "Classify an image, see which patches the prediction drew on, click a patch to see where it "
            "attends, and score each explanation."
        )
        chosen = picker.build(ctx)
        page = Page(chosen, Controls.create(chosen.model, ctx.default_method.title))
        fitted = []
        # short tab names (one row on a 390-px phone); wrapped rather than hidden behind a "more" menu if not
        with gr.Tabs(overflow_behavior="wrap"):
            for tab in TABS:
                with gr.Tab(tab.TITLE, elem_id=f"tab-{tab.TITLE.lower()}"):  # a tab's button names it (aria)
                    declared = tab.build(ctx, page)
                    wire(ctx, declared)  # its hidden ticket inputs within its tab
                fitted += [declared.fitted] if declared.fitted is not None else []
        picker.connect(ctx, chosen, demo, fitted)
    return demo


def setup(model: str, device: str = "auto", threads: int | None = None, options: Options | None = None) -> Context:
    """Pick the device, load the default model (failing fast, before serving) and size torch's CPU threads."""
    if device == "cuda" and not torch.cuda.is_available() and spaces is None:
        raise SystemExit("--device cuda: no CUDA device is available")
    if spaces is not None or (device == "auto" and torch.cuda.is_available()):
        device = "cuda"  # on ZeroGPU, CUDA is attached per call by spaces.GPU
    models = Models(torch.device("cpu" if device == "auto" else device), options)
    loaded, _ = models.get(models.set_default(model))
    if models.device.type == "cpu":
        # Small models run fastest on one thread: hand-offs between threads cost more than they save.
        torch.set_num_threads(threads or (1 if loaded.num_params() < 10_000_000 else torch.get_num_threads()))
    return Context(models, gpu=spaces.GPU) if spaces is not None else Context(models)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--host", default=None, help="address to serve on (default 127.0.0.1; 0.0.0.0 with --public and on a Space)"
    )
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--share", action="store_true", help="create a public gradio.live link")
    p.add_argument("--concurrency", type=int, default=1, help="requests computed at once (one GPU: 1)")
    g = p.add_argument_group("limits for a public server (webapp.server.admission, webapp.server.queueing)")
    g.add_argument(
        "--max-memory",
        type=int,
        default=None,
        metavar="MB",
        help=f"memory the server may use, requests included (default: {DEFAULT_SHARE * 100:.0f}%% of the "
        "container's limit, else of the machine's memory)",
    )
    g.add_argument("--max-wait", type=float, default=10.0, help="seconds a request waits for memory before 'busy'")
    g.add_argument("--max-file-mb", type=int, default=64, help="largest upload, per file (default 64)")
    g.add_argument(
        "--per-client",
        type=int,
        default=16,  # a page sends several at once (a new image: Classify and Explore), more while the user clicks
        help="requests one session may have waiting or computing (one address: twice as many; default 16)",
    )
    g.add_argument(
        "--max-connections-per-address",
        type=int,
        default=MAX_PER_ADDRESS,
        metavar="N",
        help=f"open connections one address may hold (default {MAX_PER_ADDRESS}; not behind a proxy's FORWARDED_HOPS, "
        "where every connection is the proxy's); all together, the file limit less a reserve",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads (default: 1 for models under 10M parameters, else all cores)",
    )
    add_arguments(p)
    args = p.parse_args()
    counts = args.concurrency, args.max_file_mb, args.per_client, args.max_memory or 1, args.max_connections_per_address
    if min(counts) < 1 or args.max_wait < 0:
        raise SystemExit(
            "--concurrency, --max-memory, --max-file-mb, --per-client and --max-connections-per-address must be >= 1, "
            "--max-wait >= 0"
        )
    limit_arenas()
    options = configure(args)
    tempfiles.use_own_folders()  # dead processes' folders removed, this one's made (webapp.server.tempfiles)
    tempfiles.remove_partial_uploads()
    gradio_patches.warn_if_changed()
    ctx = setup(args.model, args.device, args.threads, options)
    ctx.gate = Gate(None if args.max_memory is None else args.max_memory * MB, args.max_wait)
    demo = build_ui(ctx)
    demo.queue(default_concurrency_limit=args.concurrency, max_size=QUEUE_SIZE)
    ClientLimits(args.per_client, 2 * args.per_client).install(demo)
    payloads.install(demo, options.public)
    sessions = Sessions(rate=SessionRate() if options.public else None)  # new sessions a minute per address
    print(
        f"memory budget {ctx.gate.max_memory / MB:,.0f} MB, uploads at most {args.max_file_mb} MB, "
        f"other request bodies {MAX_JSON_BYTES / MB:g} MB, sessions {sessions.max_sessions:,}",
        flush=True,
    )
    upload_limit = max(args.max_file_mb * MB, MAX_TOTAL_BYTES)  # one upload, all its files
    # connections without a request closed after a timeout, capped per address and in all (webapp.server.queueing)
    Connections(args.max_connections_per_address).install()
    host = serving_host(args)
    # no monitoring: the API page would show its per-endpoint latencies, which say nothing useful to visitors
    demo.launch(
        server_name=host,
        server_port=args.port,
        share=args.share,
        css=CSS,
        max_file_size=args.max_file_mb * MB,
        app_kwargs={
            "middleware": [
                Middleware(BodyLimits),
                Middleware(UploadLimits, max_bytes=upload_limit),
                Middleware(RequestScope),
                Middleware(OwnCancels, blocks=demo),
            ]
        },
        enable_monitoring=False,
        prevent_thread_lock=True,
    )
    sessions.install(demo, ctx.gate)
    ctx.trainer.live = sessions.live  # a trained model whose pages are gone counts against no address
    if host == ALL_INTERFACES:
        print(f"* Serving on all interfaces: http://{_address()}:{demo.server_port}/ from other machines")
    demo.block_thread()


def _address() -> str:
    """This machine's address on its default route (no packet is sent), else its name."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


if __name__ == "__main__":
    main()
