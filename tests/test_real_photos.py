"""The real-photo check sets (bench/real_photos, and bench/ood_photos of none of the classes) and the app's
examples: they open, their classes are (or are not) CIFAR-10's, and every file's source and licence is recorded
(bench/real_photos/SOURCES.md, bench/ood_photos/SOURCES.md, examples/LICENSES.md)."""

import re
from pathlib import Path

import pytest
from PIL import Image

from bench.real_photos import CIFAR10, load_photos, read_sources
from vit_core.data import load_image

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "bench" / "real_photos"
OOD_PHOTOS = ROOT / "bench" / "ood_photos"
EXAMPLES = ROOT / "examples"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp"}


def _images(folder: Path, pattern: str) -> list[Path]:
    return sorted(p for p in folder.glob(pattern) if p.suffix.lower() in IMAGE_SUFFIXES)


def _assert_listed_with_licence(files: list[str], table: dict[str, dict[str, str]], where: str) -> None:
    missing = sorted(set(files) - set(table))
    assert not missing, f"not listed in {where}: {missing}"
    stale = sorted(set(table) - set(files))
    assert not stale, f"{where} lists files that do not exist: {stale}"
    for name in files:
        row = table[name]
        assert row.get("licence", "").strip(), f"{where}: {name} has no licence"
        source = next((v for k, v in row.items() if k.startswith("source")), "")
        assert source.strip(), f"{where}: {name} has no source"


def test_real_photo_folders_are_cifar10_classes():
    folders = sorted(p.name for p in PHOTOS.iterdir() if p.is_dir())
    assert folders and set(folders) <= set(CIFAR10), f"not CIFAR-10 classes: {set(folders) - set(CIFAR10)}"
    stray = sorted(p.name for p in PHOTOS.iterdir() if p.is_file() and p.name != "SOURCES.md")
    assert not stray, f"files outside the class folders: {stray}"
    assert all(_images(PHOTOS / f, "*") for f in folders), "a class folder without images"


@pytest.mark.parametrize("path", _images(PHOTOS, "*/*"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_photo_opens_small_rgb(path):
    img = load_image(path)
    assert img.mode == "RGB" and max(img.size) <= 256, (img.mode, img.size)


def test_real_photos_are_listed_with_source_class_and_licence():
    table = read_sources(PHOTOS / "SOURCES.md")
    files = [p.relative_to(PHOTOS).as_posix() for p in _images(PHOTOS, "*/*")]
    _assert_listed_with_licence(files, table, "bench/real_photos/SOURCES.md")
    for name in files:
        assert table[name]["class"] == name.split("/")[0], f"{name}: class column says {table[name]['class']}"
        assert table[name]["kind"] in ("photo", "cutout"), f"{name}: kind {table[name]['kind']!r}"
    assert {p.kind for p in load_photos(PHOTOS)} <= {"photo", "cutout"}


def test_real_photos_stay_small():
    total = sum(p.stat().st_size for p in PHOTOS.rglob("*") if p.is_file())
    assert total < 5 * 2**20, f"bench/real_photos holds {total / 2**20:.1f} MB (keep it under 5 MB)"


def test_ood_photos_are_none_of_the_classes_listed_small_and_open():
    table = read_sources(OOD_PHOTOS / "SOURCES.md")
    files = [p.relative_to(OOD_PHOTOS).as_posix() for p in _images(OOD_PHOTOS, "*/*")]
    assert len(files) >= 40
    _assert_listed_with_licence(files, table, "bench/ood_photos/SOURCES.md")
    groups = {name.split("/")[0] for name in files}
    assert not groups & set(CIFAR10), f"groups named as CIFAR-10 classes: {groups & set(CIFAR10)}"
    for name in files:
        assert table[name]["group"] == name.split("/")[0] and table[name]["kind"] in ("photo", "cutout"), name
        img = load_image(OOD_PHOTOS / name)
        assert img.mode in ("RGB", "L") and max(img.size) <= 256, (name, img.mode, img.size)
    total = sum(p.stat().st_size for p in OOD_PHOTOS.rglob("*") if p.is_file())
    assert total < 5 * 2**20, f"bench/ood_photos holds {total / 2**20:.1f} MB (keep it under 5 MB)"


@pytest.mark.parametrize("path", _images(EXAMPLES, "*"), ids=lambda p: p.name)
def test_example_opens_named_by_class(path):
    img = load_image(path)
    assert img.mode == "RGB" and max(img.size) <= 640 and path.stat().st_size < 150_000
    assert path.suffix == ".jpg"
    m = re.fullmatch(r"(?P<cls>[a-z]+)_[a-z0-9_]+", path.stem)
    assert m and (m["cls"] in CIFAR10 or m["cls"] == "ood"), (
        f"{path.name}: name it <class>_<what>.jpg or ood_<what>.jpg"
    )


def test_examples_are_listed_with_source_and_licence():
    table = read_sources(EXAMPLES / "LICENSES.md")
    _assert_listed_with_licence([p.name for p in _images(EXAMPLES, "*")], table, "examples/LICENSES.md")


def test_examples_keep_the_cat_and_one_out_of_distribution_photo():
    names = [p.name for p in _images(EXAMPLES, "*")]
    assert "cat_chelsea.jpg" in names  # the app tests use it
    assert sum(n.startswith("ood_") for n in names) == 1, names
    assert all(Image.open(EXAMPLES / n).format == "JPEG" for n in names)
