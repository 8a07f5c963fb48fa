"""CNN baselines trained by the same engine and data pipeline as the ViTs: timm's ResNets, for the paper's
comparison of ViTs, hybrids and ResNets at equal compute (section 4.2, figure 5).

A recipe asks for one with ``model="timm:<name>"`` (``resnet18``, ``resnet34``, ``resnet50``, ...) and may set
its stage widths, timm's ``channels`` (``model_args={"channels": (48, 96, 192, 384)}``; timm's stem stays 64
wide), to match another model's cost. timm builds it from scratch with its own initialisation. For images of
at most ``SMALL_INPUT`` pixels a side its ImageNet stem (a 7x7 convolution with stride 2, then a 3x3 max pool:
the image shrinks by 4 before the first stage) becomes a 3x3 convolution with stride 1 and no pool, the
adaptation He et al. (2016, section 4.2) made for CIFAR-10 and the usual CIFAR ResNet-18: a 32x32 image reaches
the first stage at 32x32 and the last at 4x4. These baselines are measured, not shipped: their run folders hold
the training checkpoint and metrics, no ``model.safetensors`` + ``config.json`` for the app
(``vit_core.from_pretrained`` loads ViTs).
"""

from __future__ import annotations

from torch import nn

PREFIX = "timm:"
SMALL_INPUT = 64  # up to this many pixels a side, the stem keeps the resolution (CIFAR, MNIST)


def is_cnn(model: str | None) -> bool:
    """Whether a recipe's ``model`` names a timm CNN baseline rather than a ViT of the registry."""
    return model is not None and model.startswith(PREFIX)


def create_cnn(
    model: str, num_classes: int, in_chans: int, img_hw: tuple[int, int], channels: tuple[int, ...] | None = None
) -> nn.Module:
    """timm's ResNet ``model`` ("timm:resnet18") from scratch with a ``num_classes`` head, its stem adapted
    to small images and its stages ``channels`` wide (None: timm's) (see the module docstring). A name timm
    does not know, or a model without a ResNet's ``conv1`` and ``maxpool``, is a ``ValueError``."""
    import timm

    name = model[len(PREFIX) :]
    if not timm.is_model(name):
        raise ValueError(f"model {model!r}: timm has no model {name!r}; see timm.list_models('resnet*')")
    widths = {} if channels is None else {"channels": tuple(channels)}
    try:
        net = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_chans, **widths)
    except TypeError as e:  # a model that takes no channels
        raise ValueError(f"model {model!r} with channels {channels}: {e}") from None
    if not isinstance(getattr(net, "conv1", None), nn.Conv2d) or not hasattr(net, "maxpool"):
        raise ValueError(f"model {model!r}: CNN baselines are timm ResNets (a conv1 and a maxpool), not {name!r}")
    if max(img_hw) <= SMALL_INPUT:
        net.conv1 = nn.Conv2d(in_chans, net.conv1.out_channels, 3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")  # timm's ResNet init
        net.maxpool = nn.Identity()
    return net
