"""Command line: ``python -m vit_core push RUN_DIR REPO_ID [--private] [--token-env HF_TOKEN] [--message MSG]``.

Uploads a checkpoint or training run folder (``model.safetensors``, ``config.json``, ``metrics.jsonl``,
training-curve PNGs) with a generated model card. ``--dry-run`` prints the card and the file list and
uploads nothing.
"""

from __future__ import annotations

import argparse
import os
import sys

from .io.files import CheckpointError
from .io.hub import push_to_hub
from .io.model_card import prepare_upload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vit_core", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    push = commands.add_parser("push", help="upload a checkpoint or run folder to the Hugging Face Hub")
    push.add_argument("run_dir", help="folder with model.safetensors and config.json (a finished training run)")
    push.add_argument("repo_id", help="Hub repo, 'owner/name' (created if it does not exist)")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.add_argument(
        "--token-env",
        default="HF_TOKEN",
        metavar="VAR",
        help="environment variable holding a write token (default HF_TOKEN; unset: the stored `hf auth login` token)",
    )
    push.add_argument("--message", help="commit message")
    push.add_argument("--license", default="apache-2.0", help="license in the model card (default apache-2.0)")
    push.add_argument("--dataset", help="dataset name for the card (default: from the run's recipe)")
    push.add_argument("--dry-run", action="store_true", help="print the model card and the files, upload nothing")
    args = parser.parse_args(argv)

    try:
        if args.dry_run:
            files, card = prepare_upload(args.run_dir, args.repo_id, license=args.license, dataset=args.dataset)
            print(card)
            print("would upload: " + ", ".join(["README.md", *files]), file=sys.stderr)
            return 0
        url = push_to_hub(
            args.run_dir,
            args.repo_id,
            private=args.private,
            token=os.environ.get(args.token_env) or None,
            commit_message=args.message,
            license=args.license,
            dataset=args.dataset,
        )
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"pushed {args.run_dir} to {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
