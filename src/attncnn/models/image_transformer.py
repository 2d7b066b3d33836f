"""The paper's attention-only image classifier (reference ``BertImage``, PAPER.md 2.1-2.5).

    image (B, 3, 32, 32), normalised
      -> channels-last, 2x2 space-to-depth           (B, 16, 16, 12)
      -> Linear 12 -> D                              (B, 16, 16, D)
      -> L post-LN blocks:
           attention -> Linear D->D -> dropout -> + residual -> LayerNorm(eps 1e-12)
           Linear D->512 -> GELU(erf) -> Linear 512->D -> dropout -> + residual -> LayerNorm
      -> mean over all positions -> Linear D -> classes

No positional encoding is added to the tokens (position enters only through the attention
layers) and all weights keep PyTorch's default initialisation, as in the reference code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import ATTENTION_KINDS, GridAttention, build_attention, space_to_depth

__all__ = ["ImageTransformerConfig", "TransformerBlock", "ImageTransformer"]


@dataclass
class ImageTransformerConfig:
    """Shape of an :class:`ImageTransformer`; defaults are the paper's (PAPER.md 2.6).

    Raises:
        ValueError: unknown ``attention``, a size below 1, or a ``layer_heads`` that is not one
            head count >= 1 per layer (the message names the field and the fix).
    """

    attention: str = "quadratic"        #: one of attncnn.layers.ATTENTION_KINDS
    num_layers: int = 6
    num_heads: int = 9                  #: heads N_h of every layer (unless layer_heads is given)
    dim: int = 400                      #: hidden width D
    head_dim: int | None = None         #: per-head width D_h (None: D, as in the paper)
    mlp_dim: int = 512                  #: feed-forward width
    pooling: int = 2                    #: space-to-depth patch width
    in_chans: int = 3
    num_classes: int = 10
    dropout: float = 0.1                #: hidden dropout
    attn_dropout: float = 0.1           #: dropout on attention probabilities
    layer_norm_eps: float = 1e-12
    max_size: int = 16                  #: learned tables: largest token-grid side
    table_dim: int | None = None        #: learned position-only tables: width per axis (None: D)
    center_init_std: float = 2.0        #: quadratic: std of initial centres, token units
    spread_init_std: float = 0.01       #: quadratic: noise std of initial spreads
    #: heads per layer, first to last (None: num_heads everywhere). Set by head pruning
    #: (PAPER.md 3.8), whose layers keep different numbers of heads.
    layer_heads: list[int] | None = None

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {self.attention!r}; choose one of {', '.join(ATTENTION_KINDS)}")
        for name in ("num_layers", "num_heads", "dim", "mlp_dim", "pooling", "in_chans", "num_classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        # The layers check these too, but only once weights are being allocated; checking them
        # here lets a command reject bad options from the configuration alone.
        for name in ("head_dim", "table_dim", "max_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        width = self.dim if self.head_dim is None else self.head_dim
        if self.attention == "learned-content" and width % 2:
            raise ValueError(f"learned-content attention splits each query in a row half and a column half, so "
                             f"the head width must be even, got {width}; set head_dim (or dim) to an even number")
        if self.layer_heads is not None:
            self.layer_heads = self._checked_layer_heads(self.layer_heads)

    def _checked_layer_heads(self, value) -> list[int]:
        """``layer_heads`` as a list of ints, or ValueError naming the field and the fix."""
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in value):
            raise ValueError(f"layer_heads must be a list of integers (one head count per layer) or None, "
                             f"got {value!r}")
        if len(value) != self.num_layers:
            raise ValueError(f"layer_heads has {len(value)} entries {list(value)} but the model has num_layers="
                             f"{self.num_layers}; give one head count per layer, or layer_heads=None to use "
                             f"num_heads={self.num_heads} everywhere")
        bad = [i + 1 for i, h in enumerate(value) if h < 1]
        if bad:
            raise ValueError(f"layer_heads {list(value)}: layer(s) {bad} have fewer than 1 head; every layer "
                             "needs at least one head")
        return list(value)

    def heads(self) -> list[int]:
        """Number of heads of each layer, first to last: ``layer_heads``, else ``num_heads`` repeated."""
        return list(self.layer_heads) if self.layer_heads is not None else [self.num_heads] * self.num_layers

    def attention_kwargs(self) -> dict:
        """Keyword arguments for :func:`attncnn.layers.build_attention` for this configuration."""
        kwargs: dict = {"head_dim": self.head_dim, "attn_drop": self.attn_dropout}
        if self.attention.startswith("quadratic"):
            kwargs.update(center_init_std=self.center_init_std, spread_init_std=self.spread_init_std)
        elif self.attention == "learned":
            kwargs.update(max_size=self.max_size, table_dim=self.table_dim)
        elif self.attention == "learned-content":
            kwargs.update(max_size=self.max_size)
        return kwargs


class TransformerBlock(nn.Module):
    """One post-LN encoder layer on a ``(B, H, W, D)`` grid (reference ``BertLayer``, PAPER.md 2.2).

    Args:
        config: the network's configuration.
        num_heads: heads of this layer's attention (None: ``config.num_heads``); a pruned model
            has a different count per layer (``config.layer_heads``, PAPER.md 3.8).
    """

    def __init__(self, config: ImageTransformerConfig, num_heads: int | None = None) -> None:
        super().__init__()
        d = config.dim
        heads = config.num_heads if num_heads is None else num_heads
        self.attention: GridAttention = build_attention(config.attention, d, heads, **config.attention_kwargs())
        self.attn_out = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.fc1 = nn.Linear(d, config.mlp_dim)
        self.fc2 = nn.Linear(config.mlp_dim, d)
        self.norm2 = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H, W, D) -> (B, H, W, D)``."""
        x = self.norm1(x + self.dropout(self.attn_out(self.attention(x))))
        x = self.norm2(x + self.dropout(self.fc2(F.gelu(self.fc1(x)))))
        return x


class ImageTransformer(nn.Module):
    """Attention-only classifier: normalised images ``(B, C, H, W)`` -> logits ``(B, classes)``.

    Raises (in forward):
        ValueError: wrong rank or channel count, or H/W not divisible by the pooling width.
    """

    #: architecture name stored in checkpoints (key of ``attncnn.models.ARCHITECTURES``)
    arch = "image-transformer"

    def __init__(self, config: ImageTransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Linear(config.pooling ** 2 * config.in_chans, config.dim)
        self.blocks = nn.ModuleList(TransformerBlock(config, heads) for heads in config.heads())
        self.head = nn.Linear(config.dim, config.num_classes)

    def _check_images(self, images: torch.Tensor) -> None:
        c, p = self.config.in_chans, self.config.pooling
        if images.dim() != 4 or images.shape[1] != c:
            raise ValueError(f"expected normalised images of shape (B, {c}, H, W), got {tuple(images.shape)}")
        h, w = images.shape[-2:]
        if h % p or w % p:
            raise ValueError(f"image size {h}x{w} is not divisible by the pooling width {p}: "
                             f"resize or crop images to multiples of {p}")

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Embedded token grid ``(B, H/p, W/p, D)`` before the first block."""
        self._check_images(images)
        x = images.permute(0, 2, 3, 1)                       # (B, H, W, C)
        # The residual stream stays in the weights' dtype (float32) under bf16 autocast (a no-op
        # otherwise): every block adds its bf16 branch onto it, so LayerNorm sees float32.
        return self.embed(space_to_depth(x, self.config.pooling)).to(self.embed.weight.dtype)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Output grid of the last block, ``(B, H/p, W/p, D)``."""
        x = self.tokens(images)
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(images).mean(dim=(1, 2)))

    def no_weight_decay(self) -> set[str]:
        """Full names of parameters excluded from weight decay (quadratic centres and spreads)."""
        names = set()
        for i, block in enumerate(self.blocks):
            skip = getattr(block.attention, "no_weight_decay", lambda: set())()
            names |= {f"blocks.{i}.attention.{n}" for n in skip}
        return names

    def to_dict(self) -> dict:
        return dataclasses.asdict(self.config)
