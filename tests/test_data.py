"""The data layer against published numbers (real MNIST / Fashion-MNIST / CIFAR-10), timm's own transforms,
torchvision's IDX reader, PIL, and brute-force references written out here."""

import gzip
import hashlib
import io
import random
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from timm.data import create_transform, resolve_data_config, resolve_model_data_config
from torch.utils.data import DataLoader, Subset

import vit_core
from vit_core.data import (
    Batches,
    ImageDataError,
    InMemoryImageDataset,
    build_dataset,
    build_mixup,
    build_transform,
    check_augment,
    datasets,
    default_data_root,
    load_image,
    read_header,
    to_model_mode,
)
from vit_core.data.images import target_size

from .net import free_port
from .rss import peak_of

DATA = default_data_root()


def _needs(name: str):
    return pytest.mark.skipif(not (DATA / name).is_dir(), reason=f"real data not found: {DATA / name} (set VIT_DATA)")


def _cfg(name: str = "vit_tiny_patch16_224", **overrides) -> dict:
    """A model's pretrained_cfg (the patch size only matters for the config's own checks)."""
    return vit_core.get_config(name, **{"patch_size": 4, **overrides}).pretrained_cfg()


def _noise(w: int, h: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).convert(mode)


def _encode(img: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


# ------------------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def cifar():
    return build_dataset("cifar10", "train"), build_dataset("cifar10", "test")


def test_default_data_root(monkeypatch, tmp_path):
    monkeypatch.delenv("VIT_DATA", raising=False)
    monkeypatch.setattr(datasets, "PROJECT_DATA", tmp_path)  # a checkout beside the shared data (it exists)
    assert default_data_root() == tmp_path
    monkeypatch.setenv("VIT_DATA", str(tmp_path / "elsewhere"))
    assert default_data_root() == tmp_path / "elsewhere"  # VIT_DATA wins
    monkeypatch.setenv("VIT_DATA", str(tmp_path))
    assert default_data_root() == tmp_path
    # outside a checkout beside the shared data (an installed package, a fresh clone): the user's cache
    monkeypatch.delenv("VIT_DATA")
    monkeypatch.setattr(datasets, "PROJECT_DATA", tmp_path / "absent")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_data_root() == tmp_path / "cache" / "vit_core" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_data_root() == Path.home() / ".cache" / "vit_core" / "data"


@_needs("mnist")
def test_mnist_against_published_numbers(tmp_path):
    train, test = build_dataset("mnist", "train"), build_dataset("mnist", "test")
    assert train.images.shape == (60000, 1, 28, 28) and train.images.dtype == torch.uint8
    assert len(test) == 10000 and train.classes == [str(d) for d in range(10)]
    # per-class counts from the dataset README, first labels as published
    assert torch.bincount(train.targets).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert torch.bincount(test.targets).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert train.targets[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert test.targets[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    x = train.images.float() / 255
    assert x.mean().item() == pytest.approx(0.1307, abs=5e-5) and x.std().item() == pytest.approx(0.3081, abs=5e-5)
    # pixels equal torchvision's independent IDX reader
    from torchvision.datasets.mnist import read_image_file

    raw = tmp_path / "t10k-images-idx3-ubyte"
    raw.write_bytes(gzip.decompress((DATA / "mnist" / "t10k-images-idx3-ubyte.gz").read_bytes()))
    assert torch.equal(test.images[:, 0], read_image_file(str(raw)))


@_needs("fashion-mnist")
def test_fashion_mnist_against_published_numbers():
    train, test = build_dataset("fashion-mnist", "train"), build_dataset("Fashion_MNIST", "val")
    assert (len(train), len(test)) == (60000, 10000)
    assert (
        torch.bincount(train.targets).tolist() == [6000] * 10 and torch.bincount(test.targets).tolist() == [1000] * 10
    )
    assert train.classes[0] == "T-shirt/top" and train.classes[9] == "Ankle boot" and len(train.classes) == 10
    x = train.images.float() / 255
    assert x.mean().item() == pytest.approx(0.2860, abs=5e-5) and x.std().item() == pytest.approx(0.3530, abs=5e-5)


@_needs("cifar10")
def test_cifar10_against_published_numbers(cifar):
    train, test = cifar
    assert train.images.shape == (50000, 3, 32, 32) and len(test) == 10000
    assert train.targets[:10].tolist() == [6, 9, 9, 4, 1, 1, 2, 7, 8, 3]
    assert test.targets[:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]
    assert torch.bincount(train.targets).tolist() == [5000] * 10
    assert train.classes == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    x = train.images.float() / 255
    assert x.mean((0, 2, 3)).tolist() == pytest.approx([0.4914, 0.4822, 0.4465], abs=5e-5)
    assert x.std((0, 2, 3)).tolist() == pytest.approx([0.2470, 0.2435, 0.2616], abs=5e-5)
    # the README's SHA-256 of the raw (N, 32, 32, 3) test array: pixel order and layout exact
    nhwc = test.images.permute(0, 2, 3, 1).contiguous().numpy()
    assert hashlib.sha256(nhwc.tobytes()).hexdigest().startswith("f9b1e2130bab680d")


def _write_idx(path, magic, dims, payload: bytes):
    path.write_bytes(gzip.compress(struct.pack(f">{1 + len(dims)}i", magic, *dims) + payload))


def test_idx_and_cifar_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_DATA_MIRROR", f"http://127.0.0.1:{free_port()}")  # missing files: not downloaded
    with pytest.raises(ImageDataError, match="mnist is not in .* could not be downloaded .* set VIT_DATA"):
        build_dataset("mnist", "train", root=tmp_path)
    with pytest.raises(ImageDataError, match="cifar10 is not in .*cifar-10-binary.tar.gz"):
        build_dataset("cifar10", "train", root=tmp_path)
    d = tmp_path / "mnist"
    d.mkdir(exist_ok=True)  # the failed download made it
    _write_idx(d / "t10k-images-idx3-ubyte.gz", 2049, [2, 28, 28], bytes(2 * 784))  # label magic on images
    _write_idx(d / "t10k-labels-idx1-ubyte.gz", 2049, [2], bytes(2))
    with pytest.raises(ImageDataError, match="magic number 2051"):
        build_dataset("mnist", "test", root=tmp_path)
    _write_idx(d / "t10k-images-idx3-ubyte.gz", 2051, [2, 28, 28], bytes(784))  # one image short
    with pytest.raises(ImageDataError, match="header declares"):
        build_dataset("mnist", "test", root=tmp_path)
    (d / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(ImageDataError, match="corrupt"):
        build_dataset("mnist", "test", root=tmp_path)
    _write_idx(d / "t10k-images-idx3-ubyte.gz", 2051, [2, 28, 28], bytes(range(256)) * 6 + bytes(32))
    ds = build_dataset("mnist", "test", root=tmp_path)  # a well-formed tiny file parses
    assert ds.images.shape == (2, 1, 28, 28) and ds.images[0, 0, 0, :5].tolist() == [0, 1, 2, 3, 4]
    (tmp_path / "cifar10").mkdir(exist_ok=True)
    (tmp_path / "cifar10" / "test_batch.npz").write_bytes(b"PK garbage")
    with pytest.raises(ImageDataError, match="test_batch.npz"):
        build_dataset("cifar10", "test", root=tmp_path)


def test_folders_recognised_by_their_files(tmp_path):
    """A folder holding IDX files (MNIST's layout) or CIFAR-10 npz shards is read as that format, whatever its
    name: the bytes and labels written, in memory; Fashion-MNIST's class names for a folder named so."""
    digits = tmp_path / "my_digits"
    digits.mkdir()
    pixels = bytes(range(256)) * 6 + bytes(32)  # two 28x28 images
    for prefix in ("train", "t10k"):
        _write_idx(digits / f"{prefix}-images-idx3-ubyte.gz", 2051, [2, 28, 28], pixels)
        _write_idx(digits / f"{prefix}-labels-idx1-ubyte.gz", 2049, [2], bytes([7, 3]))
    ds = build_dataset(str(digits), "test")
    assert isinstance(ds, InMemoryImageDataset) and ds.images.shape == (2, 1, 28, 28)
    assert ds.images.flatten().tolist() == list(pixels) and ds.targets.tolist() == [7, 3]
    assert ds.classes == [str(i) for i in range(10)]
    shutil.copytree(digits, tmp_path / "fashion_mnist")
    assert build_dataset(str(tmp_path / "fashion_mnist"), "train").classes[:2] == ["T-shirt/top", "Trouser"]

    shards = tmp_path / "shards"
    shards.mkdir()
    x = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    np.savez_compressed(shards / "test_batch.npz", x=x, y=np.array([1, 0, 9], dtype=np.uint8))
    ds = build_dataset(str(shards), "test")
    assert torch.equal(ds.images, torch.from_numpy(x).permute(0, 3, 1, 2)) and ds.targets.tolist() == [1, 0, 9]
    assert ds.classes[9] == "truck"
    with pytest.raises(ImageDataError, match="data_batch_1.npz not found"):
        build_dataset(str(shards), "train")


@_needs("mnist")
def test_the_shared_mnist_folder_by_path():
    by_path, by_name = build_dataset(str(DATA / "mnist"), "test"), build_dataset("mnist", "test")
    assert torch.equal(by_path.images, by_name.images) and torch.equal(by_path.targets, by_name.targets)
    assert by_path.classes == by_name.classes


# ------------------------------------------------------------------------------------ eval transform


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(img_size=384, crop_pct=1.0),
        dict(img_size=(224, 160)),
        dict(interpolation="bilinear", crop_pct=0.8),
        dict(crop_mode="squash", crop_pct=1.0),
        dict(crop_mode="squash", crop_pct=0.875, img_size=(224, 160)),
    ],
)
def test_eval_transform_equals_timm(overrides):
    cfg = _cfg(**overrides)
    ref = create_transform(**resolve_data_config(pretrained_cfg=cfg), is_training=False)
    ours = build_transform(cfg)
    for i, (w, h) in enumerate([(500, 375), (375, 500), (224, 224), (31, 47), (1000, 90), (1, 1)]):
        img = _noise(w, h, seed=i)
        assert torch.equal(ours(img), ref(img)), (w, h)


def test_eval_transform_equals_timm_model_config():
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0)
    ref = create_transform(**resolve_model_data_config(model), is_training=False)
    ours = build_transform(_cfg("vit_small_patch16_224"))
    img = _noise(320, 240, "L")  # grayscale input for an RGB model: replicated, as timm's convert("RGB")
    assert torch.equal(ours(img), ref(img.convert("RGB")))
    gray = _cfg(in_chans=1, mean=(0.5,), std=(0.25,))  # 1-channel model: luma, as PIL's convert("L")
    ref1 = create_transform(**resolve_data_config(pretrained_cfg=gray), is_training=False)
    assert torch.equal(build_transform(gray)(_noise(300, 200)), ref1(_noise(300, 200).convert("L")))


def test_eval_transform_tensor_batches_match_pil():
    imgs = [_noise(32, 32, seed=s) for s in range(4)]
    batch = torch.stack([TF.pil_to_tensor(i) for i in imgs])
    same = build_transform(_cfg(img_size=32, crop_pct=1.0))  # no resize: exact
    assert torch.equal(same(batch), torch.stack([same(i) for i in imgs]))
    assert torch.equal(same(batch[0]), same(imgs[0]))
    up = build_transform(_cfg())  # 32 -> 248 -> crop 224, as fine-tuning a 224 model on CIFAR
    diff = (up(batch) - torch.stack([up(i) for i in imgs])).abs()
    assert diff.max() <= 2.5 / 255 / 0.5 and (diff > 1.5 / 255 / 0.5).float().mean() < 1e-3  # PIL vs torch rounding
    luma = build_transform(_cfg(img_size=32, crop_pct=1.0, in_chans=1, mean=(0.5,), std=(0.5,)))
    assert torch.equal(luma(batch), torch.stack([luma(i) for i in imgs]))  # PIL's integer luma, exactly
    gray = torch.stack([TF.pil_to_tensor(i.convert("L")) for i in imgs])
    assert torch.equal(same(gray), torch.stack([same(i.convert("L")) for i in imgs]))  # replicated


def test_extreme_aspect_ratios_stay_cheap():
    t = build_transform(_cfg())
    strip = load_image(_encode(Image.new("RGB", (1, 20000), (200, 100, 50)), "PNG"))  # would resize to 248x5M
    expect = (torch.tensor([200, 100, 50]) / 255 - 0.5) / 0.5
    assert torch.allclose(t(strip), expect.view(3, 1, 1).expand(3, 224, 224), atol=1e-6)
    grad = Image.fromarray(np.tile(np.linspace(0, 255, 2000, dtype=np.float32)[:, None], (1, 3)).astype(np.uint8))
    ref = create_transform(**resolve_data_config(pretrained_cfg=_cfg()), is_training=False)(grad.convert("RGB"))
    assert (t(grad) - ref).abs().max() <= 2.5 / 255 / 0.5  # same sampling, only PIL's pass order rounds differently


# ---------------------------------------------------------------------------------------- load_image


def test_exif_orientation_applied():
    stored = Image.new("RGB", (40, 20), (255, 0, 0))
    stored.paste((0, 0, 255), (20, 0, 40, 20))  # left red, right blue
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": the stored left edge becomes the top
    img = load_image(_encode(stored, "JPEG", exif=exif.tobytes(), quality=95))
    assert img.size == (20, 40) and img.mode == "RGB"
    top, bottom = np.asarray(img)[5, 10], np.asarray(img)[35, 10]
    assert top[0] > 200 > top[2] and bottom[2] > 200 > bottom[0]


def test_odd_modes_converted():
    ramp = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)
    img = load_image(_encode(Image.fromarray(ramp), "PNG"))  # 16-bit grayscale -> 8 bit by 1/257
    assert img.mode == "L" and np.array_equal(np.asarray(img), np.rint(ramp / 257).astype(np.uint8))
    cmyk = load_image(_encode(Image.new("CMYK", (16, 16), (255, 0, 0, 0)), "JPEG", quality=95))
    assert cmyk.mode == "RGB" and np.allclose(np.asarray(cmyk)[8, 8], [0, 255, 255], atol=3)  # cyan
    pal = Image.new("P", (8, 8), 0)
    pal.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    pal.paste(1, (0, 0, 4, 8))
    img = load_image(_encode(pal, "PNG", transparency=0))  # index 0 transparent: composited on white
    assert img.mode == "RGB" and img.getpixel((1, 1)) == (255, 0, 0) and img.getpixel((6, 1)) == (255, 255, 255)
    rgba = load_image(_encode(Image.new("RGBA", (4, 4), (0, 0, 0, 128)), "PNG"))
    assert rgba.mode == "RGB" and all(abs(v - 127) <= 1 for v in rgba.getpixel((0, 0)))  # black at 50% on white
    assert load_image(_encode(Image.new("LA", (4, 4), (0, 0)), "PNG")).getpixel((0, 0)) == 255  # stays gray: L
    assert load_image(_encode(Image.new("LA", (4, 4), (0, 0)), "PNG")).mode == "L"
    assert load_image(Image.new("1", (4, 4), 1)).getpixel((0, 0)) == 255
    assert load_image(Image.new("I", (4, 4), 65535)).getpixel((0, 0)) == 255
    assert load_image(Image.new("F", (4, 4), 0.5)).getpixel((0, 0)) == 128
    assert load_image(Image.new("YCbCr", (4, 4), (255, 128, 128))).mode == "RGB"
    for src in (_noise(5, 5, "L"), _noise(5, 5)):
        for chans, mode in ((1, "L"), (3, "RGB")):
            assert to_model_mode(src, chans).tobytes() == src.convert(mode).tobytes()
    with pytest.raises(ValueError, match="1 or 3"):
        to_model_mode(_noise(5, 5), 2)


def test_animated_gif_first_frame():
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 0, 255))]
    data = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert Image.open(io.BytesIO(data)).n_frames == 2
    assert load_image(data).getpixel((4, 4)) == (255, 0, 0)


def _png_header(w: int, h: int) -> bytes:
    """A valid PNG declaring w x h 8-bit gray but holding almost no data: a decompression bomb's header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_bad_inputs_give_clear_errors(tmp_path):
    jpeg = _encode(_noise(64, 64), "JPEG")
    cases = {
        "truncated": (jpeg[: len(jpeg) // 2], "truncated"),
        "not an image": (np.random.default_rng(0).bytes(1000), "not an image"),
        "empty": (b"", "not an image"),
        "bomb 9000x9000 (under PIL's own limit)": (_png_header(9000, 9000), "81,000,000 pixels"),
        "bomb 100000x100000": (_png_header(100_000, 100_000), "refused"),
        "missing": (tmp_path / "nope.jpg", "cannot read the file"),
        "folder": (tmp_path, "cannot read the file"),
    }
    for src, message in cases.values():
        with pytest.raises(ImageDataError, match=message):
            load_image(src)
    png = bytearray(_encode(_noise(64, 64), "PNG"))
    png[100:110] = b"\xff" * 10  # corrupt compressed data inside IDAT
    with pytest.raises(ImageDataError, match="corrupt"):
        load_image(bytes(png))
    with pytest.raises(ImageDataError, match="limit of 5,000"):
        load_image(_encode(_noise(100, 100), "PNG"), max_pixels=5000)


def test_load_image_sources(tmp_path):
    img = _noise(3, 2)
    path = tmp_path / "x.png"
    img.save(path)
    with open(path, "rb") as f:
        for src in (path, str(path), path.read_bytes(), f, img):
            out = load_image(src)
            assert out.mode == "RGB" and out.tobytes() == img.tobytes()
    tiny = load_image(_encode(Image.new("RGB", (1, 1), (9, 9, 9)), "PNG"))
    assert build_transform(_cfg())(tiny).shape == (3, 224, 224)  # 1x1 upsampled


# -------------------------------------------------------------------------------------- ImageFolder


def _tree(root, layout):
    """layout: {class: [(format, mode, size), ...]}"""
    for cls, files in layout.items():
        (root / cls).mkdir(parents=True)
        for i, (fmt, mode, size) in enumerate(files):
            _noise(*size, mode=mode, seed=i).save(root / cls / f"{i}.{fmt}")


def test_image_folder(tmp_path):
    _tree(tmp_path, {"dog": [("png", "RGBA", (30, 20)), ("jpg", "L", (64, 48))], "cat": [("png", "P", (10, 10))]})
    (tmp_path / "cat" / "notes.txt").write_text("ignored")
    (tmp_path / "cat" / "nested").mkdir()
    _noise(40, 40, "CMYK").save(tmp_path / "cat" / "nested" / "deep.JPEG")
    (tmp_path / ".cache").mkdir()
    ds = build_dataset(str(tmp_path), "train", transform=build_transform(_cfg(img_size=32)))
    assert ds.classes == ["cat", "dog"] and ds.targets.tolist() == [0, 0, 1, 1] and len(ds) == 4
    for i in range(4):
        x, y = ds[i]
        assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y == ds.targets[i]
    raw = build_dataset(str(tmp_path), "test")  # no transform: uint8 RGB, native size
    assert raw[3][0].shape == (3, 48, 64) and raw[3][0].dtype == torch.uint8


def test_image_folder_train_val_split(tmp_path):
    _tree(tmp_path / "train", {"a": [("png", "RGB", (8, 8))] * 3, "b": [("png", "RGB", (8, 8))] * 2})
    _tree(tmp_path / "val", {"a": [("png", "RGB", (8, 8))], "b": [("jpg", "RGB", (8, 8))]})
    assert len(build_dataset(str(tmp_path), "train")) == 5
    assert len(build_dataset(str(tmp_path), "val")) == len(build_dataset(str(tmp_path), "test")) == 2


def test_image_folder_errors(tmp_path):
    with pytest.raises(ImageDataError, match="no such folder"):
        build_dataset(str(tmp_path / "missing"), "train")
    with pytest.raises(ImageDataError, match="no class folders"):
        build_dataset(str(tmp_path), "train")
    _tree(tmp_path, {"full": [("png", "RGB", (8, 8))]})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageDataError, match="without images: empty"):
        build_dataset(str(tmp_path), "train")
    (tmp_path / "empty" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    ds = build_dataset(str(tmp_path), "train")
    with pytest.raises(ImageDataError, match=r"broken\.jpg"):
        ds[0]
    with pytest.raises(ImageDataError, match=r"broken\.jpg"):
        list(DataLoader(ds, 2))


def test_hugging_face_missing_package_is_clear(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(ImageDataError, match="pip install datasets"):
        build_dataset("hf:cifar10", "train")


def test_hugging_face_adapter(monkeypatch):
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets not installed (optional)")
    feats = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["no", "yes"])})
    split = datasets.Dataset.from_dict({"img": [_noise(9, 7), _noise(5, 5, "L")], "label": [1, 0]}, features=feats)
    monkeypatch.setattr(datasets, "load_dataset", lambda name: datasets.DatasetDict(validation=split))
    ds = build_dataset("hf:toy", "test", transform=build_transform(_cfg(img_size=16)))
    assert ds.classes == ["no", "yes"] and ds.targets.tolist() == [1, 0]
    assert ds[1][0].shape == (3, 16, 16) and ds[1][1] == 0
    with pytest.raises(ImageDataError, match="splits"):
        build_dataset("hf:toy", "train")


# --------------------------------------------------------------------------------- train augmentation


def _seed(s: int):
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


@pytest.mark.parametrize("rand_augment", [None, "rand-m9-mstd0.5-inc1"])
def test_train_transform_is_timms_pipeline(rand_augment):
    """RandomResizedCrop, flip, RandAugment and RandomErasing are timm's: seeded alike, the bits are the same."""
    cfg = _cfg(img_size=64)
    aug = dict(crop="rrc", scale=(0.3, 1.0), rand_augment=rand_augment, re_prob=0.5, re_mode="pixel")
    ours = build_transform(cfg, train=True, augment=aug)
    ref = create_transform(
        **resolve_data_config(pretrained_cfg=cfg),
        is_training=True,
        scale=(0.3, 1.0),
        hflip=0.5,
        color_jitter=None,
        auto_augment=rand_augment,
        re_prob=0.5,
        re_mode="pixel",
    )
    for s in range(6):
        img = _noise(90, 70, seed=s)
        _seed(s)
        a = ours(img)
        _seed(s)
        assert torch.equal(a, ref(img))
    assert ours.needs_pil == (rand_augment is not None)


def test_pad_crop_flip_against_brute_force():
    torch.manual_seed(0)
    x = torch.randint(0, 256, (128, 3, 8, 8), dtype=torch.uint8)
    t = build_transform(_cfg(img_size=8, crop_pct=1.0, mean=(0, 0, 0), std=(1, 1, 1)), train=True, augment={})
    assert t.augment["crop"] == "pad" and t.augment["padding"] == 1 and t.augment["hflip"]
    out = (t(x) * 255).round().to(torch.uint8)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    seen = set()
    for i in range(128):  # each output is one of the 3x3 windows of the padded image, maybe mirrored
        windows = {(dy, dx): padded[i, :, dy : dy + 8, dx : dx + 8] for dy in range(3) for dx in range(3)}
        candidates = {(*k, f): w.flip(-1) if f else w for k, w in windows.items() for f in (False, True)}
        matches = [k for k, w in candidates.items() if torch.equal(out[i], w)]
        assert len(matches) == 1
        seen.add(matches[0])
    assert {k[:2] for k in seen} == {(dy, dx) for dy in range(3) for dx in range(3)}  # every offset occurs
    assert {k[2] for k in seen} == {False, True}  # per image, not per batch


def test_train_transform_deterministic_and_batched():
    cfg = _cfg(img_size=32, crop_pct=1.0)
    t = build_transform(cfg, train=True, augment=dict(crop="pad", hflip=True, re_prob=0.5))
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    _seed(0)
    a = t(x)
    _seed(0)
    b = t(x)
    _seed(1)
    c = t(x)
    assert torch.equal(a, b) and not torch.equal(a, c) and a.shape == (16, 3, 32, 32) and a.dtype == torch.float32
    no_aug = build_transform(cfg, train=True, augment=dict(padding=0, hflip=False))
    assert torch.equal(no_aug(x), build_transform(cfg)(x))  # nothing random left: the eval transform
    up = build_transform(_cfg(), train=True, augment=dict(crop="pad"))  # 32 -> 224 on the batch, then pad-crop
    assert up(x).shape == (16, 3, 224, 224)
    for aug in (dict(crop="rrc"), dict(rand_augment="rand-m9-mstd0.5")):  # per-image ops still take batches
        assert build_transform(cfg, train=True, augment=aug)(x).shape == (16, 3, 32, 32)
    gray = build_transform(
        _cfg(img_size=28, in_chans=1, mean=(0.13,), std=(0.31,)),
        train=True,
        augment=dict(rand_augment="rand-m9-mstd0.5", hflip=False),
    )
    assert gray(x[:2, :1, :28, :28]).shape == (2, 1, 28, 28)


def test_augment_errors():
    with pytest.raises(ValueError, match="unknown augment key.*colour_jitter"):
        build_transform(_cfg(), train=True, augment={"colour_jitter": 0.4})
    with pytest.raises(ValueError, match="crop must be"):
        build_transform(_cfg(), train=True, augment={"crop": "random"})
    with pytest.raises(ValueError, match="bad rand_augment"):
        build_transform(_cfg(), train=True, augment={"rand_augment": "rand-q9"})
    with pytest.raises(ValueError, match="lacks input_size"):
        build_transform({"mean": [0.5], "std": [0.5]})
    with pytest.raises(TypeError, match="uint8"):
        build_transform(_cfg())(torch.rand(3, 8, 8))
    # checked without an input size, wrong types included (what recipes do before loading data)
    with pytest.raises(ValueError, match=r"re_prob must be in \[0, 1\], got 'x'; re_count must be an int >= 1"):
        check_augment({"re_prob": "x", "re_count": 0})
    with pytest.raises(ValueError, match=r"scale must be \[lo, hi\] with 0 < lo <= hi <= 1, got 0.5"):
        check_augment({"scale": 0.5})
    assert check_augment({"hflip": False})["crop"] is None  # the size decides later


def test_mixup_is_timms():
    assert build_mixup(10) is None
    mix = build_mixup(10, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)
    assert isinstance(mix, timm.data.Mixup)
    x, y = mix(torch.randn(8, 3, 16, 16), torch.arange(8) % 10)
    assert x.shape == (8, 3, 16, 16) and y.shape == (8, 10) and torch.allclose(y.sum(1), torch.ones(8))


# ---------------------------------------------------------------------------------------- fast path


def test_batch_transform_equals_per_sample_items():
    """The engine's fast path (transform(images[idx]) on a batch) gives exactly what dataset[i] gives."""
    images = torch.randint(0, 256, (50, 1, 12, 12), dtype=torch.uint8)
    ds = InMemoryImageDataset(images, torch.arange(50) % 7, [str(i) for i in range(7)])
    ds.transform = build_transform(_cfg(img_size=16, crop_pct=1.0))  # 1 -> 3 channels, 12 -> 16
    idx = torch.randperm(50)[:20]
    assert torch.equal(ds.transform(ds.images[idx]), torch.stack([ds[i][0] for i in idx.tolist()]))
    assert [ds[i][1] for i in idx.tolist()] == ds.targets[idx].tolist()
    val = ds.subset([3, 1, 4])  # a held-out split that stays in memory
    assert isinstance(val, InMemoryImageDataset) and torch.equal(val[1][0], ds[1][0])
    assert val.targets.tolist() == [3, 1, 4] and val.classes == ds.classes
    ds.transform = None
    assert ds[5][0].dtype == torch.uint8 and torch.equal(ds[5][0], images[5])


def test_batches_fast_path_equals_the_dataloader_path():
    """In-memory batches transformed on the device are the DataLoader's, image for image, in training (a
    seeded permutation per epoch, split over processes) and in evaluation (every image once, in order)."""
    images = torch.randint(0, 256, (30, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    tf = build_transform(_cfg(img_size=8))
    fast = InMemoryImageDataset(images, torch.arange(30), [str(i) for i in range(30)], tf)  # label = index
    slow = Subset(fast, range(30))  # not in memory: goes through a DataLoader
    slow.transform = tf
    for train in (True, False):
        labels = []
        for rank in (0, 1):
            a, b = (Batches(d, 4, torch.device("cpu"), train=train, rank=rank, world=2, seed=3) for d in (fast, slow))
            assert a.fast and not b.fast
            a.set_epoch(2)
            b.set_epoch(2)
            pairs = list(zip(a, b, strict=True))
            assert len(pairs) == len(a) == (3 if train else 4)  # 15 images each: 3 full batches, or all 15
            for (xa, ya), (xb, yb) in pairs:
                assert torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(xa, tf(images[ya]))
            labels.append(torch.cat([y for (_, y), _ in pairs]).tolist())
        if train:  # two disjoint shares of one shuffled epoch
            assert not set(labels[0]) & set(labels[1]) and labels[0] != sorted(labels[0])
        else:  # rank r takes images r, r + 2, ...
            assert labels == [list(range(0, 30, 2)), list(range(1, 30, 2))]


def test_alternating_flips_show_each_image_both_ways_every_two_epochs():
    """augment hflip 'alternate' (airbench): over any two consecutive epochs every image comes once as it is and
    once mirrored; the half mirrored on even epochs is fixed by the seed (about half the images, another half for
    another seed). Random flips (hflip true) show half of them the same way round both times. Datasets
    that go through a DataLoader are refused: the flip needs each image's index."""
    n, cpu = 400, torch.device("cpu")
    images = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    plain = build_transform(_cfg(img_size=8, crop_pct=1.0))  # the same pixels, unaugmented

    def mirrored(hflip, seed: int, epoch: int) -> torch.Tensor:
        tf = build_transform(_cfg(img_size=8, crop_pct=1.0), train=True, augment=dict(crop="none", hflip=hflip))
        batches = Batches(InMemoryImageDataset(images, torch.arange(n), list("ab"), tf), 50, cpu, train=True, seed=seed)
        batches.set_epoch(epoch)
        out = torch.zeros(n, dtype=torch.bool)
        for x, y in batches:  # label = index
            ref = plain(images[y])
            same, flipped = ((x - r).abs().amax(dim=(1, 2, 3)) == 0 for r in (ref, ref.flip(-1)))
            assert torch.all(same ^ flipped)
            out[y] = flipped
        return out

    epochs = [mirrored("alternate", 3, e) for e in range(4)]
    assert all(torch.equal(epochs[e], ~epochs[e + 1]) for e in range(3)) and torch.equal(epochs[0], epochs[2])
    assert 150 < int(epochs[0].sum()) < 250  # Binomial(400, 1/2): 5 standard deviations
    assert 0.4 < float((mirrored("alternate", 4, 0) == epochs[0]).float().mean()) < 0.6  # another seed's half
    random = [mirrored(True, 3, e) for e in (0, 1)]
    assert 0.4 < float((random[0] == random[1]).float().mean()) < 0.6  # independent draws: half agree (4 sd)
    tf = build_transform(_cfg(img_size=8, crop_pct=1.0), train=True, augment=dict(hflip="alternate"))
    slow = Subset(InMemoryImageDataset(images, torch.arange(n), list("ab"), tf), range(n))
    slow.transform = tf
    with pytest.raises(ImageDataError, match="hflip 'alternate' .* needs an in-memory dataset"):
        Batches(slow, 50, cpu, train=True)
    with pytest.raises(ValueError, match="hflip must be true, false or 'alternate', got 'sometimes'"):
        check_augment({"hflip": "sometimes"})


def test_image_folder_through_dataloader(tmp_path):
    _tree(tmp_path, {"a": [("png", "RGBA", (8, 8))] * 3, "b": [("jpg", "L", (9, 7))] * 2})
    t = build_transform(_cfg(img_size=8), train=True, augment=dict(rand_augment="rand-m9-mstd0.5", re_prob=0.5))
    ds = build_dataset(str(tmp_path), "train", transform=t)
    batches = list(DataLoader(ds, 2, num_workers=2))  # mixed modes and sizes collate: all (3, 8, 8)
    assert batches[0][0].shape == (2, 3, 8, 8) and torch.cat([y for _, y in batches]).tolist() == [0, 0, 0, 1, 1]


@_needs("mnist")
def test_mnist_train_batches():
    ds = build_dataset("mnist", "train")
    tf = build_transform(_cfg(img_size=28, crop_pct=1.0), train=True, augment={"hflip": False})
    x = tf(ds.images[torch.randperm(len(ds))[:256]])
    assert x.shape == (256, 3, 28, 28) and x.dtype == torch.float32
    assert x.min() == pytest.approx(-1.0) and x.max() == pytest.approx(1.0)


def test_crop_box_is_the_region_the_eval_transform_keeps():
    cfg = {
        "input_size": (3, 224, 224),
        "mean": (0.5,) * 3,
        "std": (0.5,) * 3,
        "crop_pct": 0.875,
        "interpolation": "bilinear",
    }
    tf = build_transform(cfg)
    w, h = 400, 300
    left, top, right, bottom = tf.crop_box(w, h)
    side = 0.875 * min(w, h)  # a centred square of crop_pct times the short side
    assert right - left == pytest.approx(side, abs=1) and bottom - top == pytest.approx(side, abs=1)
    assert (left + right) / 2 == pytest.approx(w / 2, abs=1) and (top + bottom) / 2 == pytest.approx(h / 2, abs=1)
    # Cropping the original there and resizing gives what the transform gives (up to resampling order).
    rng = np.random.default_rng(0)
    smooth = Image.fromarray(rng.integers(0, 255, (h // 20, w // 20, 3), dtype=np.uint8)).resize((w, h))
    normalise_only = build_transform({**cfg, "crop_pct": 1.0})  # a 224x224 input passes through unresized
    expected = normalise_only(smooth.crop((left, top, right, bottom)).resize((224, 224), Image.BILINEAR))
    assert (tf(smooth) - expected).abs().mean() < 0.02
    # Small images are upsampled first, so the same rule holds: 0.875 * 80 = 70 px, centred.
    assert tf.crop_box(100, 80) == (15.0, 5.0, 85.0, 75.0)
    # Squashed, the model sees the whole image (crop_pct 1) or its centre crop_pct of each side.
    assert build_transform({**cfg, "crop_mode": "squash", "crop_pct": 1.0}).crop_box(w, h) == (0.0, 0.0, w, h)
    left, top, right, bottom = build_transform({**cfg, "crop_mode": "squash"}).crop_box(w, h)
    assert right - left == pytest.approx(0.875 * w, abs=2) and bottom - top == pytest.approx(0.875 * h, abs=2)


# ------------------------------------------------------------------------------- reduced decoding


def _smooth(w: int, h: int) -> Image.Image:
    """A photo-like image (smooth gradients and edges), where reduced decoding and resizing agree closely."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 127 + 127 * np.sin(x / w * 6.3)
    g = 127 + 127 * np.cos(y / h * 4.1)
    b = np.where((x - w / 2) ** 2 + (y - h / 2) ** 2 < (h / 3) ** 2, 230.0, 40.0)
    return Image.fromarray(np.stack([r, g, b], -1).astype(np.uint8))


def test_the_header_gives_the_cost_before_any_pixel_is_decoded():
    bomb = read_header(_png_header(9000, 5000), max_pixels=50_000_000)  # no pixel data at all: never decoded
    assert (bomb.size, bomb.format, bomb.mode, bomb.pixels) == ((9000, 5000), "PNG", "L", 45_000_000)
    assert bomb.decode_bytes() == 1 * 45_000_000 + 28 * 45_000_000  # gray: 1 byte a pixel, and the result
    assert target_size((9000, 5000), 2048) == (2048, 1138)
    assert target_size((20000, 100), 2048, 256) == (20000, 100)  # never enlarged; the short side is kept
    assert target_size((20000, 1000), 2048, 256) == (5120, 256)  # the model's short side wins over max_side
    with pytest.raises(ImageDataError, match="limit of 1,000"):
        read_header(_png_header(100, 100), max_pixels=1000)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the header's size is the upright one
    rotated = read_header(_encode(_noise(40, 20), "JPEG", exif=exif.tobytes()))
    assert rotated.size == (20, 40) and rotated.format == "JPEG"
    # JPEG decodes at the largest DCT scale (1/2, 1/4, 1/8) still at least the target, as Pillow's draft
    jpeg = read_header(_encode(_noise(4000, 3000), "JPEG"))
    assert jpeg.decoded_size(1000) == (1000, 750) and jpeg.decoded_size(1500) == (2000, 1500)
    assert jpeg.decoded_size(2048) == jpeg.decoded_size() == (4000, 3000)  # half would be under 2048: full
    assert read_header(_encode(_noise(40, 30), "PNG")).decoded_size(10) == (40, 30)  # other formats: full size


@pytest.mark.parametrize(
    ("fmt", "mode"), [("JPEG", "RGB"), ("PNG", "RGB"), ("PNG", "RGBA"), ("PNG", "P"), ("PNG", "I;16")]
)
def test_large_images_are_decoded_reduced(fmt, mode):
    """A 4000x3000 image with max_side 1000 comes back 1000x750, as close to the full decode resized (the
    reference) as resampling allows, upright and converted as at full size; its peak memory is what the
    header's estimate says, and for JPEG (decoded at 1/4 scale) a small part of the full decode's 48 MB."""
    full = _smooth(4000, 3000)
    src = {"RGBA": full.convert("RGBA"), "P": full.convert("P"), "I;16": full.convert("L")}.get(mode, full)
    if mode == "I;16":
        src = Image.fromarray(np.asarray(src).astype(np.uint16) * 257)
    data = _encode(src, fmt, **({"quality": 95} if fmt == "JPEG" else {"compress_level": 1}))
    header = read_header(data)
    img, peak = peak_of(lambda: load_image(data, max_side=1000))
    reference = load_image(data).resize((1000, 750), Image.BICUBIC)
    assert img.size == (1000, 750) and img.mode == reference.mode
    diff = np.abs(np.asarray(img, dtype=np.float32) - np.asarray(reference, dtype=np.float32))
    assert diff.mean() < 1.5 and np.percentile(diff, 99) < 12, (diff.mean(), np.percentile(diff, 99))
    assert peak <= 1.1 * header.decode_bytes(1000) + (4 << 20), (peak >> 20, header.decode_bytes(1000) >> 20)
    if fmt == "JPEG":
        assert header.decoded_size(1000) == (1000, 750) and peak < 12 << 20  # 48 MB at full size
    assert load_image(data, max_side=5000).size == (4000, 3000)  # small enough: as before


def test_reduced_decoding_keeps_the_models_short_side_and_the_orientation():
    exif = Image.Exif()
    exif[0x0112] = 6
    data = _encode(_smooth(3000, 200), "JPEG", exif=exif.tobytes())
    img = load_image(data, max_side=1000, min_side=100)
    assert img.size == (100, 1500)  # upright 200x3000, halved: the short side stays >= 100
    assert load_image(data).size == (200, 3000)
