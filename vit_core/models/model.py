"""The Vision Transformer of Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021).

The forward pass is the paper's eq. 1-4:

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos        (1)  patch embedding + position embedding
    z'_l = MSA(LN(z_{l-1})) + z_{l-1},   l = 1..L          (2)  pre-norm self-attention, residual
    z_l  = MLP(LN(z'_l)) + z'_l,          l = 1..L          (3)  pre-norm MLP, residual
    y    = LN(z_L^0)                                       (4)  final norm, read the class token

Parameter names and shapes are timm's (``timm.models.vision_transformer``), so state dicts move
between the two libraries unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import ViTConfig
from .hybrid import ConvStem, ResNetV2Stem
from .pos_embed import resample_pos_embed

if TYPE_CHECKING:
    from ..calibration import Calibration


class PatchEmbed(nn.Module):
    """Split the image into P x P patches and project each linearly: x_p^i E in eq. 1.

    A convolution with kernel = stride = P applies the same matrix E to every flattened patch, so it
    *is* the paper's linear projection (the test suite checks this against an explicit unfold + matmul).
    For hybrids (section 3.1) the patches are 1x1 cells of a ResNet feature map instead of pixels.
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.patch_size = cfg.patch_size
        self.backbone = None
        if cfg.backbone_layers:
            self.backbone = ResNetV2Stem(cfg.backbone_layers, cfg.in_chans)
        elif cfg.stem_channels:
            self.backbone = ConvStem(
                cfg.stem_channels, cfg.stem_strides, cfg.in_chans, cfg.stem_pools, cfg.stem_whiten, cfg.stem_act
            )
        in_dim = self.backbone.out_chans if self.backbone is not None else cfg.in_chans
        self.proj = nn.Conv2d(in_dim, cfg.embed_dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.grid_size = cfg.grid_size
        self.in_chans = cfg.in_chans
        self.stride = cfg.feature_stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) image -> (B, h, w, D) grid of patch embeddings."""
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected images shaped (B, {self.in_chans}, H, W), got {tuple(x.shape)}")
        if self.backbone is None and (x.shape[-2] % self.patch_size or x.shape[-1] % self.patch_size):
            raise ValueError(f"image size {tuple(x.shape[-2:])} is not a multiple of the patch size {self.patch_size}")
        if self.backbone is not None:
            x = self.backbone(x)
        return self.proj(x).permute(0, 2, 3, 1)


class Attention(nn.Module):
    """Multi-head self-attention (MSA, paper appendix A): softmax(q k^T / sqrt(D_h)) v per head."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, attn_drop: float, proj_drop: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)  # [U_q U_k U_v] of eq. 5, all heads at once
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)  # U_msa of eq. 8
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, return_attention: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, D = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        dropout = self.attn_drop if self.training else 0.0
        # The fused kernel never materialises the (T, T) probabilities: fast, and the plain call's path.
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
        attn = None
        if return_attention:
            # eq. 6: A = softmax(q k^T / sqrt(D_h)), the same probabilities the fused kernel uses
            # (before attention dropout).
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            if torch.is_grad_enabled():
                # Straight-through: the value stays the fused kernel's bit for bit (a - a == 0 exactly),
                # while the gradient flows only through A @ v, so d(output)/dA exists for gradient
                # rollout and q, k, v get the same gradient as the unfused formula.
                pv = attn @ v
                out = out.detach() + (pv - pv.detach())
        out = out.transpose(1, 2).reshape(B, T, D)
        return self.proj_drop(self.proj(out)), attn


class Mlp(nn.Module):
    """The MLP of eq. 3: two layers with a GELU non-linearity."""

    def __init__(self, dim: int, hidden: int, drop: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch for a whole sample with probability p."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Block(nn.Module):
    """One transformer encoder layer: eq. 2 then eq. 3 (pre-norm, residual)."""

    def __init__(self, cfg: ViTConfig, drop_path: float) -> None:
        super().__init__()
        dim = cfg.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.attn = Attention(dim, cfg.num_heads, cfg.qkv_bias, cfg.attn_drop_rate, cfg.proj_drop_rate)
        self.norm2 = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.mlp = Mlp(dim, int(dim * cfg.mlp_ratio), cfg.proj_drop_rate)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, return_attention: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, attn = self.attn(self.norm1(x), return_attention)
        x = x + self.drop_path(y)  # eq. 2
        x = x + self.drop_path(self.mlp(self.norm2(x)))  # eq. 3
        return x, attn


class VisionTransformer(nn.Module):
    """ViT classifier. Build one with ``vit_core.create_model`` or ``vit_core.from_pretrained``."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.config = cfg
        D = cfg.embed_dim
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.patch_embed = PatchEmbed(cfg)
        n_patches = cfg.grid_size[0] * cfg.grid_size[1]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + n_patches, D))  # E_pos
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)
        # stochastic depth grows linearly with depth, 0 for the first block to drop_path_rate for the last
        rates = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.ModuleList(Block(cfg, r) for r in rates)
        # timm's layout: with average pooling the final LayerNorm moves after the pooling (fc_norm).
        use_fc_norm = cfg.global_pool == "avg"
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(D, eps=cfg.norm_eps)
        self.fc_norm = nn.LayerNorm(D, eps=cfg.norm_eps) if use_fc_norm else nn.Identity()
        self.pre_logits = _PreLogits(D, cfg.representation_size) if cfg.representation_size else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.num_features = cfg.representation_size or D
        self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.grad_checkpointing = False
        # What the checkpoint knows about its probabilities (vit_core.calibration): None until calibrated
        self.calibration: Calibration | None = None
        if self.pos_embed.device.type != "meta":  # a meta model holds shapes only, for loading into
            self.init_weights()

    # ----------------------------------------------------------------------------------- forward

    def forward_features(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Images (B, C, H, W) -> tokens (B, T, D) after the final norm (eq. 1-3 and the LN of eq. 4).

        Any H, W that are multiples of the patch size work: the position embeddings are interpolated
        to the input's grid on the fly. With average pooling (timm's ``fc_norm`` layout) the final norm
        comes after pooling, so these tokens are the last block's output.
        """
        x, attentions = self.forward_blocks(self.to_tokens(self.patch_embed(x)), return_attention)
        x = self.norm(x)
        return (x, attentions) if return_attention else x

    def to_tokens(self, grid: torch.Tensor) -> torch.Tensor:
        """Eq. 1: a (B, h, w, D) grid of patch embeddings -> (B, T, D) tokens, with the class token in front
        and the position embeddings (resized to h x w) added, then dropout."""
        B, h, w, D = grid.shape
        pos_embed = self.pos_embed
        if (h, w) != self.patch_embed.grid_size:
            pos_embed = resample_pos_embed(pos_embed, (h, w), self.patch_embed.grid_size, self.num_prefix_tokens)
        x = grid.reshape(B, h * w, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
        return self.pos_drop(x + pos_embed)

    def forward_blocks(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Eq. 2-3 for every layer: tokens (B, T, D) -> (the last block's tokens, each block's attention
        probabilities, or Nones without ``return_attention``)."""
        attentions = []
        for block in self.blocks:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                # recompute the block in backward instead of storing its activations: memory for compute
                x, attn = checkpoint(block, x, return_attention, use_reentrant=False)
            else:
                x, attn = block(x, return_attention)
            attentions.append(attn)
        return x, attentions

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits: pool (class token, eq. 4, or mean of patch tokens), then classify."""
        x = x[:, self.num_prefix_tokens :].mean(dim=1) if self.config.global_pool == "avg" else x[:, 0]
        x = self.pre_logits(self.fc_norm(x))
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits (B, num_classes); with ``return_attention=True`` also each block's attention
        probabilities, a list of (B, heads, T, T) tensors whose rows sum to 1. The logits are the
        same bits either way."""
        if return_attention:
            tokens, attentions = self.forward_features(x, return_attention=True)
            return self.forward_head(tokens), attentions
        return self.forward_head(self.forward_features(x))

    # ---------------------------------------------------------------------------------- helpers

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """Preprocessing in timm's ``pretrained_cfg`` layout."""
        return self.config.pretrained_cfg()

    @property
    def label_names(self) -> list[str] | None:
        return list(self.config.label_names) if self.config.label_names else None

    @property
    def class_names(self) -> list[str]:
        """A name for every output: the label names, or "0".."N-1" when the checkpoint has none."""
        return self.label_names or [str(i) for i in range(self.config.num_classes)]

    def reset_classifier(self, num_classes: int, label_names: list[str] | None = None) -> None:
        """Replace the head with a zero-initialised one for ``num_classes`` classes.

        Zero init is what the paper does when fine-tuning (section 3.2): the new head starts by
        predicting uniform probabilities, so early gradients don't wreck the pre-trained features.
        """
        p = next(self.parameters())
        self.head = (
            nn.Linear(self.num_features, num_classes, device=p.device, dtype=p.dtype) if num_classes else nn.Identity()
        )
        if num_classes:
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
        self.config = self.config.replace(num_classes=num_classes, label_names=label_names)
        self.calibration = None  # a new head's probabilities are not the calibrated ones

    @torch.no_grad()
    def init_weights(self, mode: str = "timm") -> None:
        """Initialise for training from scratch, as the reference implementations do.

        - ``"timm"`` (default, timm and DeiT): linear weights and position embeddings
          ``trunc_normal_(std=.02)`` (timm's bounds are +-2 absolute, so in effect untruncated),
          biases 0, class token normal(1e-6).
        - ``"jax"`` (google-research/vision_transformer): linear weights Xavier-uniform, MLP biases
          normal(1e-6), patch projection LeCun-normal, position embeddings normal(.02), class token 0,
          and the classifier head zero.
        Norm layers start as identity (weight 1, bias 0); the hybrid stem keeps PyTorch's conv init.
        """
        if mode not in ("timm", "jax"):
            raise ValueError(f"init mode must be 'timm' or 'jax', got {mode!r}")
        if mode == "timm":
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
            if self.cls_token is not None:
                nn.init.normal_(self.cls_token, std=1e-6)
        else:
            nn.init.normal_(self.pos_embed, std=0.02)
            if self.cls_token is not None:
                nn.init.zeros_(self.cls_token)
            # LeCun normal: a standard normal truncated at 2 sigma, rescaled to variance 1 / fan_in
            w = self.patch_embed.proj.weight
            nn.init.trunc_normal_(w, std=1.0, a=-2.0, b=2.0).mul_(1.0 / (math.sqrt(w[0].numel()) * 0.87962566103423978))
            nn.init.zeros_(self.patch_embed.proj.bias)
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                if mode == "timm":
                    nn.init.trunc_normal_(m.weight, std=0.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif name == "head":
                    nn.init.zeros_(m.weight)
                    nn.init.zeros_(m.bias)
                else:
                    nn.init.xavier_uniform_(m.weight)
                    if m.bias is not None:
                        nn.init.normal_(m.bias, std=1e-6) if "mlp" in name else nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def load_state_dict(
        self,
        state_dict: Mapping[str, torch.Tensor],
        strict: bool = True,
        assign: bool = False,
        pos_embed_grid: tuple[int, int] | None = None,
    ) -> Any:
        """``nn.Module.load_state_dict`` that first resizes ``pos_embed`` to this model's grid, so a
        224 checkpoint loads into a 384 model (paper section 3.2). ``pos_embed_grid``: the checkpoint's
        token grid (rows, cols), needed when it is not square. Every loader resizes through here."""
        pos = state_dict.get("pos_embed")
        D = self.pos_embed.shape[-1]
        if pos is not None and pos.shape[-1] == D and (pos.shape != self.pos_embed.shape or pos_embed_grid):
            new = resample_pos_embed(pos, self.patch_embed.grid_size, pos_embed_grid, self.num_prefix_tokens)
            state_dict = {**state_dict, "pos_embed": new}
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    # timm's hooks for its optimizer factory (weight-decay exclusions, layer-wise lr decay)

    def no_weight_decay(self) -> set[str]:
        """Parameters that get no weight decay besides biases and norms: the embeddings."""
        return {"pos_embed", "cls_token"}

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups by depth, for layer-wise lr decay (timm's ``param_groups_layer_decay``):
        embeddings are layer 0, block i is layer i + 1 with the final norm joining the last block, and the
        head comes last. ``coarse`` (timm's convention: the bare stage regex) groups by block alone, which
        leaves the final norm with the head."""
        blocks = r"^blocks\.(\d+)"
        return {
            "stem": r"^cls_token|^pos_embed|^patch_embed",
            "blocks": blocks if coarse else [(blocks, None), (r"^norm", (99999,))],
        }

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass to save activation memory (big variants)."""
        self.grad_checkpointing = enable

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class _PreLogits(nn.Module):
    """The paper's pre-training head (section 3.1): one hidden layer with tanh. Dropped for
    fine-tuning. timm's key names (``pre_logits.fc``); timm itself drops these weights on load."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, hidden)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))
