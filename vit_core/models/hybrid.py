"""The CNN stems of hybrid models (paper section 3.1): the paper's ResNet (R50+ViT-B/16, R50+ViT-L/32)
and a small convolutional stem (``ConvStem``) for hybrids trained from scratch on small data.

A BiT-style ResNetV2 *without* pre-activation (Kolesnikov et al. 2020): weight-standardised
convolutions, GroupNorm(32), TensorFlow 'SAME' padding, and stages of bottleneck blocks. Its last
feature map is cut into 1x1 "patches" by ``PatchEmbed``. Module names follow timm's ``ResNetV2``
(``stem.conv``, ``stages.N.blocks.M.conv1`` ...) so the hybrid checkpoints of timm and of the original
JAX release load unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    """TensorFlow 'SAME' padding: output size ceil(input / stride), extra pixel on the bottom/right."""
    pads = []
    for size in (x.shape[-1], x.shape[-2]):  # F.pad wants (left, right, top, bottom)
        total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads, value=value)


class StdConv2dSame(nn.Conv2d):
    """Conv2d whose weights are standardised per output channel before use (Weight Standardization,
    Qiao et al. 2019; BiT uses it with GroupNorm), with 'SAME' padding."""

    def __init__(self, in_chs: int, out_chs: int, kernel: int, stride: int = 1, eps: float = 1e-8) -> None:
        super().__init__(in_chs, out_chs, kernel, stride=stride, bias=False)
        self.eps = eps

    def standardized_weight(self) -> torch.Tensor:
        # (w - mean) / sqrt(var + eps) per output channel; batch_norm over a (1, out, fan_in) view is
        # the fused form of exactly that (biased variance), and the one timm uses.
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None, training=True, eps=self.eps)
        return w.reshape_as(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(pad_same(x, self.kernel_size[0], self.stride[0]), self.standardized_weight(), None, self.stride)


class GroupNormAct(nn.GroupNorm):
    """GroupNorm(32 groups) followed by an optional ReLU."""

    def __init__(self, channels: int, act: bool = True) -> None:
        super().__init__(32, channels, eps=1e-5)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        return F.relu(x) if self.act else x


class Stem(nn.Module):
    """7x7/2 convolution, GroupNorm + ReLU, 3x3/2 max pool: the image shrinks by 4."""

    def __init__(self, in_chans: int, out_chs: int = 64) -> None:
        super().__init__()
        self.conv = StdConv2dSame(in_chans, out_chs, 7, stride=2)
        self.norm = GroupNormAct(out_chs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x))
        return F.max_pool2d(pad_same(x, 3, 2, value=float("-inf")), 3, 2)


class Downsample(nn.Module):
    """Projection shortcut: 1x1 convolution (strided) and GroupNorm without activation."""

    def __init__(self, in_chs: int, out_chs: int, stride: int) -> None:
        super().__init__()
        self.conv = StdConv2dSame(in_chs, out_chs, 1, stride=stride)
        self.norm = GroupNormAct(out_chs, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (strided, as ResNet v1.5) -> 1x1 bottleneck, post-activation, residual."""

    def __init__(self, in_chs: int, out_chs: int, stride: int, downsample: bool) -> None:
        super().__init__()
        mid = out_chs // 4
        self.downsample = Downsample(in_chs, out_chs, stride) if downsample else None
        self.conv1 = StdConv2dSame(in_chs, mid, 1)
        self.norm1 = GroupNormAct(mid)
        self.conv2 = StdConv2dSame(mid, mid, 3, stride=stride)
        self.norm2 = GroupNormAct(mid)
        self.conv3 = StdConv2dSame(mid, out_chs, 1)
        self.norm3 = GroupNormAct(out_chs, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.norm1(self.conv1(x))
        x = self.norm2(self.conv2(x))
        x = self.norm3(self.conv3(x))
        return F.relu(x + shortcut)


class Stage(nn.Module):
    def __init__(self, in_chs: int, out_chs: int, depth: int, stride: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(Bottleneck(in_chs if i == 0 else out_chs, out_chs, stride if i == 0 else 1, i == 0) for i in range(depth))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ResNetV2Stem(nn.Module):
    """Stem plus stages with 256, 512, 1024, 2048 channels; every stage after the first halves the
    resolution, so (3, 4, 9) has stride 16 and (3, 4, 6, 3) stride 32."""

    def __init__(self, layers: tuple[int, ...], in_chans: int = 3) -> None:
        super().__init__()
        self.stem = Stem(in_chans)
        chans = _stage_channels(layers)
        self.stages = nn.Sequential(
            *(Stage(64 if i == 0 else chans[i - 1], chans[i], d, 1 if i == 0 else 2) for i, d in enumerate(layers))
        )
        self.out_chans = chans[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))

    @staticmethod
    def state_shapes(layers: tuple[int, ...], in_chans: int = 3) -> dict[str, tuple[int, ...]]:
        """The shape of every state-dict entry, from the arguments alone (nothing is built)."""
        s = {"stem.conv.weight": (64, in_chans, 7, 7), "stem.norm.weight": (64,), "stem.norm.bias": (64,)}
        in_chs = 64
        for i, (depth, out) in enumerate(zip(layers, _stage_channels(layers), strict=True)):
            mid = out // 4
            for j in range(depth):
                b = f"stages.{i}.blocks.{j}."
                if j == 0:
                    s |= {b + "downsample.conv.weight": (out, in_chs, 1, 1)} | _norm(b + "downsample.norm", out)
                s[b + "conv1.weight"] = (mid, in_chs if j == 0 else out, 1, 1)
                s[b + "conv2.weight"] = (mid, mid, 3, 3)
                s[b + "conv3.weight"] = (out, mid, 1, 1)
                s |= _norm(b + "norm1", mid) | _norm(b + "norm2", mid) | _norm(b + "norm3", out)
            in_chs = out
        return s

    @staticmethod
    def feature_maps(layers: tuple[int, ...]) -> list[tuple[int, int]]:
        """(channels, stride) of the stem convolution's output and of each stage's."""
        return [(64, 2), *((c, 4 * 2**i) for i, c in enumerate(_stage_channels(layers)))]


def _stage_channels(layers: tuple[int, ...]) -> list[int]:
    return [256 * 2**i for i in range(len(layers))]


def _norm(name: str, channels: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (channels,), f"{name}.bias": (channels,)}


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}  # a conv stem's, by ViTConfig.stem_act


class ConvNormAct(nn.Module):
    """3x3 convolution (no bias), an optional max pool, BatchNorm, ReLU (or GELU, as airbench).

    Pooling before the norm (as airbench, Jordan 2024) normalises the smaller map: same function,
    a quarter of the BatchNorm and activation work at pool 2.
    """

    def __init__(self, in_chs: int, out_chs: int, stride: int, pool: int = 1, act: str = "relu") -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_chs, out_chs, 3, stride=stride, padding=1, bias=False)
        self.pool = pool
        self.norm = nn.BatchNorm2d(out_chs)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.pool > 1:
            x = F.max_pool2d(x, self.pool, ceil_mode=True)
        return self.act(self.norm(x))


def whitening_weights(images: torch.Tensor, kernel: int, eps: float = 5e-4) -> torch.Tensor:
    """airbench's whitening filters (Jordan 2024) from (N, C, H, W) normalised images: the eigenvectors
    v_i of the covariance of their kernel x kernel patches, each scaled by 1 / sqrt(lambda_i + eps), and
    their negatives: (2 C k^2, C, k, k). A convolution with them maps every patch to coordinates of
    (near) unit variance and no correlation, so the first trained layer sees decorrelated inputs.
    """
    c = images.shape[1]
    patches = images.unfold(2, kernel, 1).unfold(3, kernel, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, c * kernel**2)
    patches = patches.double()
    cov = patches.T @ patches / len(patches)  # second moment about zero, as airbench: normalised images
    eigenvalues, eigenvectors = torch.linalg.eigh(cov)  # ascending
    filters = (eigenvectors.T / torch.sqrt(eigenvalues + eps)[:, None]).flip(0)  # largest variance first
    filters = filters.reshape(-1, c, kernel, kernel).float()
    return torch.cat([filters, -filters])


class WhiteningConv(nn.Conv2d):
    """The k x k convolution with airbench's whitening filters (``whitening_weights``), 'SAME' padding so
    that the image keeps its size; the filters are frozen, the bias is trained."""

    def __init__(self, in_chans: int, kernel: int) -> None:
        super().__init__(in_chans, 2 * in_chans * kernel**2, kernel)
        self.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(pad_same(x, self.kernel_size[0], 1))


class ConvStem(nn.Module):
    """A few 3x3 conv + BatchNorm + ReLU layers (Xiao et al. 2021, "Early Convolutions Help Transformers
    See Better"): the hybrid's CNN when the paper's ResNet-50 is far too big, e.g. for 32x32 images.

    Each layer with stride 2 or pool 2 halves the resolution (output side ceil(input / 2)). Local
    features and translation equivariance come from the convolutions, so the transformer on top trains
    fast on small data; the patch projection (a 1x1 convolution) then maps each cell to a token.
    ``whiten``: airbench's frozen whitening convolution first (``whitening_weights``), then ``act``.
    """

    def __init__(
        self,
        channels: tuple[int, ...],
        strides: tuple[int, ...],
        in_chans: int = 3,
        pools: tuple[int, ...] | None = None,
        whiten: int | None = None,
        act: str = "relu",
    ) -> None:
        super().__init__()
        self.whiten = None
        self.act = ACTIVATIONS[act]
        if whiten is not None:  # frozen filters, set from the training images (whitening_weights)
            self.whiten = WhiteningConv(in_chans, whiten)
        ins = (self.whiten.out_channels if self.whiten is not None else in_chans, *channels[:-1])
        pools = pools or (1,) * len(channels)
        self.layers = nn.Sequential(
            *(ConvNormAct(*args, act=act) for args in zip(ins, channels, strides, pools, strict=True))
        )
        self.out_chans = channels[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.whiten is not None:
            x = self.act(self.whiten(x))
        return self.layers(x)

    @torch.no_grad()
    def dirac_(self) -> None:
        """airbench's initialisation (Jordan 2024): each convolution's first filters, as many as it has input
        channels, pass their input through unchanged (``nn.init.dirac_``: a 1 at the centre tap of their own
        channel); the rest keep their initialisation. Each layer starts near an identity plus new features."""
        for layer in self.layers:
            w = layer.conv.weight
            nn.init.dirac_(w[: w.shape[1]])

    @staticmethod
    def state_shapes(
        channels: tuple[int, ...], in_chans: int = 3, whiten: int | None = None
    ) -> dict[str, tuple[int, ...]]:
        """The shape of every state-dict entry (BatchNorm's running statistics included), from the
        arguments alone (nothing is built)."""
        s: dict[str, tuple[int, ...]] = {}
        if whiten is not None:
            s = {
                "whiten.weight": (2 * in_chans * whiten**2, in_chans, whiten, whiten),
                "whiten.bias": (2 * in_chans * whiten**2,),
            }
            in_chans = 2 * in_chans * whiten**2
        for i, (c_in, c_out) in enumerate(zip((in_chans, *channels[:-1]), channels, strict=True)):
            n = f"layers.{i}.norm."
            s[f"layers.{i}.conv.weight"] = (c_out, c_in, 3, 3)
            s |= {n + k: (c_out,) for k in ("weight", "bias", "running_mean", "running_var")}
            s[n + "num_batches_tracked"] = ()
        return s

    @staticmethod
    def feature_maps(
        channels: tuple[int, ...], strides: tuple[int, ...], pools: tuple[int, ...] | None = None
    ) -> list[tuple[int, int]]:
        """(channels, stride) of each layer's output."""
        steps = [s * p for s, p in zip(strides, pools or (1,) * len(strides), strict=True)]
        return [(c, math.prod(steps[: i + 1])) for i, c in enumerate(channels)]
