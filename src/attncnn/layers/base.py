"""Multi-head self-attention over a token grid: what every attention layer shares.

Every layer maps a channels-last grid ``(B, H, W, D)`` to ``(B, H, W, D_out)``. Each of the N_h
heads averages value vectors of width ``head_dim`` with its own attention map; the averages are
concatenated and mapped by one linear layer ``value`` (``N_h*head_dim -> D_out``). With the paper's
``head_dim = D`` (as the reference code) there is no projection before the average: ``value`` holds
the folded matrices ``W^(h) = W_val^(h) W_out`` of Lemma 1 (head h owns input columns
``h*D:(h+1)*D``); otherwise a projection ``value_in: D -> N_h*head_dim`` comes first.

What a layer declares (its class attributes, ``check_config`` and ``local_init_``) is read by
:mod:`attncnn.layers.registry`, the models and the analysis tools.

Two families implement the maps: position-only layers (:mod:`~attncnn.layers.position_only`) and
content layers (:mod:`~attncnn.layers.content`); :meth:`GridAttention.attention_probs` gives
either's probabilities; the products with the values are in :mod:`~attncnn.layers.mixing`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import InputError
from .autocast_rules import autocast_dtype

__all__ = ["GridAttention", "check_input_dtype"]

#: the dtypes autocast casts to its own in a matrix product (it leaves float64 alone)
_AUTOCAST_CASTS = (torch.float32, torch.float16, torch.bfloat16)


def check_input_dtype(x: torch.Tensor, parameter: torch.Tensor, owner: str, module: str = "layer",
                      name: str = "x") -> None:
    """Refuse an input whose dtype the products with ``parameter`` cannot take, before PyTorch
    answers with "mat1 and mat2 must have the same dtype" from deep inside the forward. Under
    :func:`torch.autocast` on the input's device, float32/float16/bfloat16 inputs and parameters mix
    freely; float64 on either side does not (autocast leaves float64 alone).

    Args:
        x: the input tensor.
        parameter: a weight of the first product the input meets (its dtype is the module's).
        owner: the module's name for the message (``"QuadraticAttention"``).
        module, name: how the fix names the module (``"layer"``, ``"model"``) and the input
            (``"x"``, ``"images"``).

    Raises:
        InputError: naming both dtypes and the fixes: convert the input or the module, or (for a
            half-precision input) run under ``torch.autocast``.
    """
    if x.dtype == parameter.dtype:
        return
    if x.dtype in _AUTOCAST_CASTS and parameter.dtype in _AUTOCAST_CASTS and autocast_dtype(x.device) is not None:
        return
    autocast = (f", or keep {parameter.dtype} weights and run under torch.autocast(\"{x.device.type}\", "
                f"dtype={x.dtype}) for mixed precision" if x.dtype in (torch.float16, torch.bfloat16) else "")
    raise InputError(f"{owner} got a {x.dtype} input but its parameters are {parameter.dtype}: convert the input "
                     f"({name}.to({parameter.dtype})) or the {module} ({module}.to({x.dtype})){autocast}")


class GridAttention(nn.Module):
    """Base class: declarations, input checks, value vectors, the folded value/output matrix.

    Args:
        dim: token width D of the input grid.
        num_heads: number of heads N_h.
        head_dim: width D_h of each head's value vectors (default D, as in the paper).
        out_dim: output width D_out (default D).
        attn_drop: dropout probability on the attention probabilities (paper: 0.1).
        impl: computation path of the forward without probabilities, one of the layer's
            :attr:`impls` (``"auto"`` lets the layer choose; every path computes the same output).
        eval_impl: the path in eval mode (test passes), when it should differ from ``impl``; None:
            ``impl`` in both modes.

    Raises:
        InputError: a size below 1, or an ``impl``/``eval_impl`` the layer does not have (the
            message lists them).
    """

    #: Registry names of this class (first: the default kind).
    KINDS: ClassVar[tuple[str, ...]] = ()
    #: Fields of the model configuration this class takes, as constructor arguments of the same name.
    CONFIG_KEYS: ClassVar[tuple[str, ...]] = ()
    #: Those of :attr:`CONFIG_KEYS` that are an error, away from their default, with another kind.
    EXCLUSIVE_KEYS: ClassVar[tuple[str, ...]] = ()
    #: Computation paths of the forward without probabilities; "auto" chooses among the others.
    IMPLS: ClassVar[tuple[str, ...]] = ("auto",)
    #: True when the attention probabilities do not depend on the input.
    position_only: ClassVar[bool] = False
    #: True when the scores have a positional term (every layer except plain content attention).
    has_positional_term: ClassVar[bool] = False
    #: True when heads are Gaussians with learned ``centers`` and spreads (quadratic encoding).
    has_centers: ClassVar[bool] = False
    #: True when heads mix a content and a positional map with learned gates (GPSA).
    has_gates: ClassVar[bool] = False

    def __init__(self, dim: int, num_heads: int, *, head_dim: int | None = None,
                 out_dim: int | None = None, attn_drop: float = 0.0, impl: str = "auto",
                 eval_impl: str | None = None) -> None:
        super().__init__()
        if dim < 1 or num_heads < 1:
            raise InputError(f"dim and num_heads must be positive, got dim={dim}, num_heads={num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim if head_dim is None else head_dim
        self.out_dim = dim if out_dim is None else out_dim
        if self.head_dim < 1 or self.out_dim < 1:
            raise InputError(f"head_dim and out_dim must be positive, got {self.head_dim}, {self.out_dim}")
        self.value_in = None if self.head_dim == dim else nn.Linear(dim, num_heads * self.head_dim)
        self.value = nn.Linear(num_heads * self.head_dim, self.out_dim)
        self.attn_drop = nn.Dropout(attn_drop)
        self.impl = impl
        self.eval_impl = eval_impl

    # -- declarations --------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        """This layer's name in the registry (:data:`attncnn.layers.ATTENTION_KINDS`)."""
        return self.KINDS[0]

    @classmethod
    def impls_of(cls, kind: str) -> tuple[str, ...]:
        """The computation paths a layer of ``kind`` has (``"auto"`` first)."""
        return cls.IMPLS

    @property
    def impls(self) -> tuple[str, ...]:
        """The computation paths this layer has (``"auto"`` first)."""
        return type(self).impls_of(self.kind)

    @property
    def impl(self) -> str:
        """The computation path the forward takes when no probabilities are asked for."""
        return self._impl

    @impl.setter
    def impl(self, name: str) -> None:
        if name not in self.impls:
            raise InputError(f"{self.kind} attention has no impl {name!r}; choose one of {', '.join(self.impls)}")
        self._impl = name

    @property
    def eval_impl(self) -> str | None:
        """The computation path in eval mode, or None when it is :attr:`impl`."""
        return self._eval_impl

    @eval_impl.setter
    def eval_impl(self, name: str | None) -> None:
        if name is not None and name not in self.impls:
            raise InputError(f"{self.kind} attention has no impl {name!r} (eval_impl); choose one of "
                             f"{', '.join(self.impls)} or None")
        self._eval_impl = name

    @property
    def mode_impl(self) -> str:
        """The ``impl`` of the current mode: :attr:`eval_impl` in eval mode when it is set, else
        :attr:`impl` (what each layer's :meth:`path` resolves)."""
        return self._eval_impl if not self.training and self._eval_impl is not None else self._impl

    @classmethod
    def kind_kwargs(cls, kind: str) -> dict:
        """Constructor arguments that the kind name itself implies (``{}`` for most kinds; a class
        serving several kinds tells them apart here)."""
        return {}

    @classmethod
    def config_kwargs(cls, kind: str, config: Any) -> dict:
        """Constructor arguments for a layer of ``kind`` from a model configuration (duck-typed:
        any object with the fields ``head_dim``, ``attn_dropout``, ``impl`` and :attr:`CONFIG_KEYS`)."""
        kwargs = {"head_dim": config.head_dim, "attn_drop": config.attn_dropout, "impl": config.impl,
                  "eval_impl": getattr(config, "eval_impl", None)}
        kwargs.update({key: getattr(config, key) for key in cls.CONFIG_KEYS})
        return {**kwargs, **cls.kind_kwargs(kind)}

    @classmethod
    def check_config(cls, kind: str, config: Any) -> None:
        """Reject a configuration this kind cannot build, before any weight is allocated.

        The base checks ``impl``; subclasses add theirs (call ``super()``). ``config.init ==
        "conv"`` asks for :meth:`local_init_`.

        Raises:
            InputError: naming the field and the fix.
        """
        if config.impl not in cls.impls_of(kind):
            raise InputError(f"{kind} attention has no impl {config.impl!r}; choose one of "
                             f"{', '.join(cls.impls_of(kind))}")
        eval_impl = getattr(config, "eval_impl", None)
        if eval_impl is not None and eval_impl not in cls.impls_of(kind):
            raise InputError(f"{kind} attention has no impl {eval_impl!r} (eval_impl); choose one of "
                             f"{', '.join(cls.impls_of(kind))} or leave eval_impl unset")
        if config.init == "conv" and not cls.has_positional_term:
            raise InputError(f"init='conv' needs a positional attention kind ({kind} attention has no positional "
                             f"term); choose a kind with one ({', '.join(positional_kinds())}) or init='random'")

    @torch.no_grad()
    def local_init_(self, shifts: torch.Tensor, alpha: float) -> None:
        """Give head h the positional score ``-alpha |delta - shifts[h]|^2`` (+ a constant per query).

        Called by :func:`attncnn.layers.local_init_`, which checks ``alpha`` and the head count.

        Args:
            shifts: ``(N_h, 2)`` centers in tokens, in the parameters' device and dtype.
            alpha: locality strength, > 0.

        Raises:
            InputError: the layer has no positional term, or its tables are too narrow.
        """
        raise InputError(f"{type(self).__name__} has no positional term, so it cannot start as a convolution; "
                         f"use a positional kind ({', '.join(positional_kinds())}) or init='random'")

    # -- shared computation --------------------------------------------------------------------

    def path(self, height: int, width: int) -> str:
        """The path the forward takes without probabilities on an ``height x width`` grid, in the
        current mode (train/eval): ``impl`` with ``"auto"`` resolved (and, in training with
        dropout on the maps, the path that dropout needs)."""
        raise NotImplementedError

    def path_unavailable(self, impl: str, device: torch.device, *, backward: bool) -> str | None:
        """Why the path ``impl`` cannot train (``backward``) or run a test pass fast on ``device``, or
        None when it can (the path choice leaves such paths out)."""
        return None

    def attention_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Attention probabilities of the real input ``x (B, H, W, D)``, float32 at least:
        ``(1, N_h, H*W, H*W)`` for position-only layers, ``(B, N_h, H*W, H*W)`` otherwise
        (queries on dim -2, keys on dim -1, tokens row-major); each row sums to 1.

        Raises:
            InputError: wrong rank or channel count.
        """
        raise NotImplementedError

    def check_input(self, x: torch.Tensor) -> tuple[int, int, int]:
        """``(B, H, W)`` of a channels-last grid ``x``, checked for every layer's forward.

        Raises:
            InputError: wrong rank or channel count (the message gives the expected shape), or a
                dtype the layer's products cannot take: another than its parameters' outside
                autocast, float64 against float32 under it (:func:`check_input_dtype`).
        """
        if x.dim() != 4 or x.shape[-1] != self.dim:
            raise InputError(
                f"{type(self).__name__} expects a channels-last token grid (B, H, W, {self.dim}), "
                f"got shape {tuple(x.shape)}")
        check_input_dtype(x, self.value.weight, type(self).__name__)
        b, h, w, _ = x.shape
        return b, h, w

    def head_values(self, x: torch.Tensor) -> torch.Tensor:
        """Value vectors per head: ``(B, H, W, D) -> (B, N_h, H*W, D_h)``; with ``head_dim == dim``
        a broadcast view of the tokens (no copy)."""
        b, h, w, d = x.shape
        if self.value_in is None:
            return x.reshape(b, 1, h * w, d).expand(b, self.num_heads, h * w, d)
        return self.projected_values(x)

    def projected_values(self, x: torch.Tensor) -> torch.Tensor | None:
        """Per-head values ``(B, N_h, H*W, D_h)`` of the projection ``value_in``, or None when heads are
        as wide as the model (every head then averages the tokens themselves)."""
        if self.value_in is None:
            return None
        b, h, w, _ = x.shape
        return self.value_in(x).reshape(b, h * w, self.num_heads, self.head_dim).transpose(1, 2)

    def output(self, mixed: torch.Tensor, b: int, h: int, w: int) -> torch.Tensor:
        """``(B, N_h, H*W, D_h)`` head averages -> ``(B, H, W, D_out)`` through ``value``."""
        mixed = mixed.transpose(1, 2).reshape(b, h * w, self.num_heads * self.head_dim)
        return self.value(mixed).reshape(b, h, w, self.out_dim)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, out_dim={self.out_dim}, "
                f"impl={self.impl!r}" + ("" if self.eval_impl is None else f", eval_impl={self.eval_impl!r}"))


def positional_kinds() -> tuple[str, ...]:
    """Every defined attention kind whose scores have a positional term, in definition order (read
    from the classes, so that error messages name exactly the kinds there are)."""
    kinds, stack = [], list(GridAttention.__subclasses__())
    while stack:
        cls = stack.pop(0)
        stack[:0] = cls.__subclasses__()
        kinds += [k for k in cls.KINDS if cls.has_positional_term and k not in kinds]
    return tuple(kinds)
