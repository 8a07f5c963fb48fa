"""A held-out share of the shared photo sets' ``train`` splits, for choosing a recipe without looking at ``val``.

    python -m bench.photo_split                 # runs/photo_split/<set>/{fit,held}/<class>/<file> (links)

Each photo of ``photos/<set>/train/<class>/`` under the data root goes to ``held`` when the SHA-256 of its file
name falls in the lowest ``HELD_SHARE`` (``vit_core.data.photos.in_held_share``: a split that does not change when
files are added), else to ``fit``. A recipe trained for choosing takes ``"share": "fit"`` in its photos' specs (the
same photos); ``python -m bench.photo_answers --split held`` measures the ``held`` share.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from vit_core.data import default_data_root
from vit_core.data.photos import in_held_share

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "photo_split"
SETS = ("cats_and_dogs", "cars_birds_deer_frogs_horses", "ants_and_bees")


def split(dataset: str, out: Path = OUT) -> Path:
    """``out/<dataset>`` with ``fit`` and ``held`` folders of links to the set's ``train`` photos; made once."""
    folder = out / dataset
    if folder.is_dir():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for cls in sorted(p for p in (default_data_root() / "photos" / dataset / "train").iterdir() if p.is_dir()):
        for photo in sorted(cls.iterdir()):
            dest = tmp / ("held" if in_held_share(photo.name) else "fit") / cls.name
            dest.mkdir(parents=True, exist_ok=True)
            (dest / photo.name).symlink_to(photo.resolve())
    tmp.rename(folder)
    return folder


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    for dataset in SETS:
        folder = split(dataset)
        counts = {part: sum(1 for _ in (folder / part).rglob("*.*")) for part in ("fit", "held")}
        print(f"{folder}: {counts['fit']} fit, {counts['held']} held out")


if __name__ == "__main__":
    main()
