"""The paper's attention-only image classifier (reference ``BertImage``, ``models/transformer.py``).

    image (B, 3, 32, 32), normalised
      -> channels-last, 2x2 space-to-depth           (B, 16, 16, 12)
      -> Linear 12 -> D                              (B, 16, 16, D)
      -> L post-LN blocks:
           attention -> Linear D->D -> dropout -> + residual -> LayerNorm(eps 1e-12)
           Linear D->512 -> GELU(erf) -> Linear 512->D -> dropout -> + residual -> LayerNorm
      -> mean over all positions -> Linear D -> classes

No positional encoding is added to the tokens (position enters only through the attention
layers) and all weights keep PyTorch's default
initialisation, as in the reference code, unless ``init`` or ``value_init`` says otherwise
(:class:`ImageTransformerConfig`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..layers import (ATTENTION_LAYERS, GridAttention, attention_class, build_attention, check_input_dtype,
                      conv_kernel_size, conv_value_init_, local_init_, mimetic_init_, space_to_depth)

__all__ = ["ImageTransformerConfig", "TransformerBlock", "ImageTransformer"]

log = logging.getLogger(__name__)

#: Values of ``ImageTransformerConfig.init``.
INITS = ("random", "conv", "mimetic")
#: Values of ``ImageTransformerConfig.value_init``.
VALUE_INITS = ("random", "conv")
#: Values of ``ImageTransformerConfig.pos_embed``.
POS_EMBEDS = ("none", "learned")


@dataclass
class ImageTransformerConfig:
    """Shape of an :class:`ImageTransformer`; defaults are the paper's (reference ``runs/*.sh``).

    Raises:
        InputError: unknown ``attention``, a size below 1, a ``layer_heads`` that is not one
            head count >= 1 per layer, an option another attention kind owns (``freeze_gate``
            without GPSA), an ``impl`` or ``eval_impl`` the kind does not have, or
            convolutional-init options that do not fit (unknown ``init``/``value_init``,
            ``num_heads`` not ``K^2`` for an odd K, and the layer's own checks: a kind without
            positional term, tables too narrow); the message names the field and the fix.
    """

    attention: str = "quadratic"        #: one of attncnn.layers.ATTENTION_KINDS
    #: computation path of every attention layer: "auto" (the layer chooses) or one of its kind's
    #: paths (every path computes the same output); missing in older configs: "auto"
    impl: str = "auto"
    #: the path in eval mode (test passes) when it differs from impl; None: impl in both modes
    eval_impl: str | None = None
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
    table_dim: int | None = None        #: learned, learned-content-9ffaa tables: width per axis (None: D)
    center_init_std: float = 2.0        #: quadratic: std of initial centers, token units
    spread_init_std: float = 0.01       #: quadratic: noise std of initial spreads
    #: heads per layer, first to last (None: num_heads everywhere); set by head pruning (reference
    #: ``runs/quadratic-generalized-pruned``)
    layer_heads: list[int] | None = None
    #: "random" (PyTorch's default init, as the reference), "conv" (head h of every layer starts on
    #: the h-th shift of a K x K kernel, ConViT's local init; layers whose head count is not K^2
    #: keep the random init) or "mimetic" (content kinds: W_q W_k^T near +0.7 I and W_v W_o near
    #: -0.4 I, Trockman & Kolter 2023; layers.mimetic_init_)
    init: str = "random"
    #: alpha of init="conv", in 1/tokens^2; 1.0 is ConViT's default locality strength (the same
    #: score up to a constant per query), twice the reference's random-init alpha (s^2/2 = 0.5);
    #: it puts 0.32 of an interior query's attention on the target token
    locality_strength: float = 1.0
    conv_kernel_size: int | None = None  #: K of init="conv" (None: sqrt(num_heads)); K odd, K^2 == num_heads
    conv_dilation: int = 1              #: spacing of init="conv"'s shifts, tokens
    #: "random", or "conv" (with init="conv", heads as wide as the model): the folded value matrix
    #: holds a K x K kernel drawn with nn.Conv2d's default init (the value map's own distribution:
    #: with init="conv" every layer already computes *some* K x K convolution at step 0; only the
    #: random stream differs)
    value_init: str = "random"
    freeze_gate: bool = False           #: gpsa: keep the gates' lambda at its initial value 1
    qk_bias: bool = True                #: content, gpsa: biases on queries and keys (ConViT: False)
    qk_init_std: float | None = None    #: content, gpsa: query/key weights ~ N(0, std^2) truncated (ConViT: 0.02)
    #: "none" (the paper: position enters only through the attention layers) or "learned": a learned
    #: absolute position embedding added to the tokens after the embedding (DeiT's and ConViT's),
    #: (1, H/p, W/p, D) for images of image_size x image_size, N(0, 0.02^2) truncated, no weight decay
    pos_embed: str = "none"
    image_size: int = 32                #: image side the learned position embedding is built for

    def __post_init__(self) -> None:
        layer_class = attention_class(self.attention)        # ValueError listing the kinds
        for name in ("num_layers", "num_heads", "dim", "mlp_dim", "pooling", "in_chans", "num_classes"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        # The layers check these too, but only once weights are being allocated; checking them
        # here lets a command reject bad options from the configuration alone.
        for name in ("head_dim", "table_dim", "max_size", "conv_kernel_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("dropout", "attn_dropout"):      # torch.nn.Dropout would refuse them only when built
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise InputError(f"{name} must be a probability between 0 and 1 (the share of values dropped), got "
                                 f"{value!r}; e.g. --set {name}=0.1, or 0 for none")
        if self.layer_heads is not None:
            self.layer_heads = self._checked_layer_heads(self.layer_heads)
        self._check_foreign_options(layer_class)
        self._check_init()
        layer_class.check_config(self.attention, self)      # the kind's own checks (impl, tables, ...)

    def _check_foreign_options(self, layer_class: type) -> None:
        """An option that another kind owns exclusively (its ``EXCLUSIVE_KEYS``, e.g. GPSA's
        ``freeze_gate``), set away from its default: ValueError naming it."""
        own = set(layer_class.CONFIG_KEYS)
        for key in sorted({k for cls in ATTENTION_LAYERS.values() for k in cls.EXCLUSIVE_KEYS} - own):
            default = type(self).__dataclass_fields__[key].default
            if getattr(self, key) != default:
                kinds = sorted(kind for kind, cls in ATTENTION_LAYERS.items() if key in cls.CONFIG_KEYS)
                raise InputError(f"{key} applies to attention={' or '.join(map(repr, kinds))} only, got "
                                 f"attention={self.attention!r}; remove {key} (default {default!r}) or change "
                                 "attention")

    def _check_init(self) -> None:
        """The options of the convolutional init and of GPSA; ValueError naming the field and the fix."""
        if self.pos_embed not in POS_EMBEDS:
            raise InputError(f"pos_embed must be one of {', '.join(POS_EMBEDS)}, got {self.pos_embed!r}")
        if self.pos_embed == "learned" and (self.image_size < 1 or self.image_size % self.pooling):
            raise InputError(f"pos_embed='learned' needs image_size divisible by the pooling width {self.pooling}, "
                             f"got {self.image_size}; set image_size to the side of the training images")
        for name, values in (("init", INITS), ("value_init", VALUE_INITS)):
            if getattr(self, name) not in values:
                raise InputError(f"{name} must be one of {', '.join(values)}, got {getattr(self, name)!r}")
        if self.init == "mimetic":
            self._check_mimetic()
        if not (isinstance(self.locality_strength, (int, float)) and 0 < self.locality_strength < math.inf):
            raise InputError(f"locality_strength must be a positive finite number (alpha, 1/tokens^2; ConViT: 1.0), "
                             f"got {self.locality_strength!r}")
        self.locality_strength = float(self.locality_strength)
        if self.conv_dilation < 1:
            raise InputError(f"conv_dilation must be >= 1, got {self.conv_dilation}")
        if self.value_init == "conv" and self.init != "conv":
            raise InputError("value_init='conv' needs init='conv' (the kernel's taps need heads on its shifts); "
                             "set init='conv' or value_init='random'")
        if self.value_init == "conv" and self.head_dim not in (None, self.dim):
            raise InputError(f"value_init='conv' needs heads as wide as the model (head_dim None or {self.dim}), "
                             f"got head_dim={self.head_dim}; set head_dim=None or value_init='random'")
        if self.init == "conv" and ATTENTION_LAYERS[self.attention].has_positional_term:
            conv_kernel_size(self.num_heads, self.conv_kernel_size)     # K^2 == num_heads, K odd (names the fix)

    def _check_mimetic(self) -> None:
        """``init="mimetic"`` needs queries and keys and a ``D x D`` value product (:func:`mimetic_init_`)."""
        if not hasattr(ATTENTION_LAYERS[self.attention], "queries_keys"):
            raise InputError(f"init='mimetic' sets queries and keys; {self.attention} attention has none: choose a "
                             "content kind (content, learned-content, gpsa) or another init")
        head_dim = self.dim if self.head_dim is None else self.head_dim
        if any(heads * head_dim != self.dim for heads in self.heads()):
            fix = (f"set head_dim={self.dim // self.num_heads}" if self.dim % self.num_heads == 0 else
                   f"choose num_heads dividing dim {self.dim}")
            raise InputError(f"init='mimetic' needs num_heads x head_dim = dim (W_v W_o is D x D), got "
                             f"{self.num_heads} x {head_dim} vs dim {self.dim}; {fix}")

    def _checked_layer_heads(self, value) -> list[int]:
        """``layer_heads`` as a list of ints, or ValueError naming the field and the fix."""
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in value):
            raise InputError(f"layer_heads must be a list of integers (one head count per layer) or None, "
                             f"got {value!r}")
        if len(value) != self.num_layers:
            raise InputError(f"layer_heads has {len(value)} entries {list(value)} but the model has num_layers="
                             f"{self.num_layers}; give one head count per layer, or layer_heads=None to use "
                             f"num_heads={self.num_heads} everywhere")
        bad = [i + 1 for i, h in enumerate(value) if h < 1]
        if bad:
            raise InputError(f"layer_heads {list(value)}: layer(s) {bad} have fewer than 1 head; every layer "
                             "needs at least one head")
        return list(value)

    def heads(self) -> list[int]:
        """Number of heads of each layer, first to last: ``layer_heads``, else ``num_heads`` repeated."""
        return list(self.layer_heads) if self.layer_heads is not None else [self.num_heads] * self.num_layers

    def attention_kwargs(self) -> dict:
        """Keyword arguments for :func:`attncnn.layers.build_attention` for this configuration
        (the kind's ``config_kwargs``: head width, dropout, impl and its own keys)."""
        return attention_class(self.attention).config_kwargs(self.attention, self)


class TransformerBlock(nn.Module):
    """One post-LN encoder layer on a ``(B, H, W, D)`` grid (reference ``BertLayer``).

    Args:
        config: the network's configuration.
        num_heads: heads of this layer's attention (None: ``config.num_heads``); a pruned model
            has a different count per layer (``config.layer_heads``).
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
        InputError: wrong rank or channel count, or H/W not divisible by the pooling width.
    """

    #: architecture name stored in checkpoints (key of ``attncnn.models.ARCHITECTURES``)
    arch = "image-transformer"

    def __init__(self, config: ImageTransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Linear(config.pooling ** 2 * config.in_chans, config.dim)
        self.blocks = nn.ModuleList(TransformerBlock(config, heads) for heads in config.heads())
        self.head = nn.Linear(config.dim, config.num_classes)
        self.pos_embed = None
        if config.pos_embed == "learned":                   # after the other weights: their draws are unchanged
            side = config.image_size // config.pooling
            self.pos_embed = nn.Parameter(torch.empty(1, side, side, config.dim))
            nn.init.trunc_normal_(self.pos_embed, std=0.02, a=-2.0, b=2.0)
        if config.init == "conv":
            self._conv_init()
        elif config.init == "mimetic":
            for block in self.blocks:
                mimetic_init_(block.attention)

    def _conv_init(self) -> None:
        """``init="conv"``: every layer with K^2 heads starts on the kernel's shifts (and, with
        ``value_init="conv"``, holds a random K x K kernel in its value matrix)."""
        cfg = self.config
        k = conv_kernel_size(cfg.num_heads, cfg.conv_kernel_size)
        for i, block in enumerate(self.blocks):
            if block.attention.num_heads != k * k:
                log.debug("layer %d has %d heads, not %d: it keeps the random init", i + 1,
                          block.attention.num_heads, k * k)
                continue
            local_init_(block.attention, alpha=cfg.locality_strength, dilation=cfg.conv_dilation)
            if cfg.value_init == "conv":
                conv_value_init_(block.attention)

    def _check_images(self, images: torch.Tensor) -> None:
        c, p = self.config.in_chans, self.config.pooling
        if images.dim() != 4 or images.shape[1] != c:
            raise InputError(f"expected normalised images of shape (B, {c}, H, W), got {tuple(images.shape)}")
        h, w = images.shape[-2:]
        if h % p or w % p:
            raise InputError(f"image size {h}x{w} is not divisible by the pooling width {p}: "
                             f"resize or crop images to multiples of {p}")
        check_input_dtype(images, self.embed.weight, type(self).__name__, "model", "images")   # before the embedding

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Embedded token grid ``(B, H/p, W/p, D)`` before the first block."""
        self._check_images(images)
        x = images.permute(0, 2, 3, 1)                       # (B, H, W, C)
        # The residual stream stays in the weights' dtype (float32) under bf16 autocast (a no-op
        # otherwise): every block adds its bf16 branch onto it, so LayerNorm sees float32.
        tokens = self.embed(space_to_depth(x, self.config.pooling)).to(self.embed.weight.dtype)
        if self.pos_embed is None:
            return tokens
        if tokens.shape[1:3] != self.pos_embed.shape[1:3]:
            h, w = images.shape[-2:]
            fix = (f"build the model for them (model option image_size={h}; --set image_size={h} on the command "
                   "line) or resize them" if h == w else "resize them")
            raise InputError(f"this model's learned position embedding is for {self.config.image_size}x"
                             f"{self.config.image_size} images, got {h}x{w}; {fix} (an absolute embedding does "
                             "not transfer to other sizes)")
        return tokens + self.pos_embed

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Output grid of the last block, ``(B, H/p, W/p, D)``."""
        x = self.tokens(images)
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(images).mean(dim=(1, 2)))

    def attention_paths(self, image_height: int = 32, image_width: int = 32) -> list[str]:
        """The computation path of each block's attention (first block first) on images of this
        size, in the model's current mode: what a run records it trained (or evaluated) with.

        Raises:
            InputError: a size not divisible by the pooling width.
        """
        p = self.config.pooling
        if image_height % p or image_width % p:
            raise InputError(f"image size {image_height}x{image_width} is not divisible by the pooling width {p}")
        return [block.attention.path(image_height // p, image_width // p) for block in self.blocks]

    def no_weight_decay(self) -> set[str]:
        """Full names of parameters excluded from weight decay (quadratic centers and spreads, GPSA
        positional vectors and gates, the learned position embedding as in DeiT)."""
        names = {"pos_embed"} if self.pos_embed is not None else set()
        for i, block in enumerate(self.blocks):
            skip = getattr(block.attention, "no_weight_decay", lambda: set())()
            names |= {f"blocks.{i}.attention.{n}" for n in skip}
        return names

    def to_dict(self) -> dict:
        return dataclasses.asdict(self.config)
