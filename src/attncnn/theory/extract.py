"""The converse of Theorem 1: the convolution closest to a positional attention layer, and how close.

For a position-only attention layer (quadratic, generalised quadratic or learned relative),
:func:`conv_from_attention` reads each head's center of attention (quadratic ``centers``, else the
mean shift of the middle query of a grid), assigns heads to the K x K grid of kernel shifts (the
paper's ``ΔΔ_K`` times the dilation; optimal assignment or nearest shift), and reads each head's
folded value matrix W^(h) of Lemma 1 as the kernel slice of its shift. It reports per head the
center, shift, distance, sharpness and target mass, and on given inputs the output error. For a
layer built by :func:`~attncnn.theory.attention_from_conv2d` it returns the original kernel and
zero distances (on the channels the layer reproduces).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from ..errors import InputError
from ..layers import PositionalAttention, QuadraticAttention
from .construct import AttentionConv2d, kernel_shifts

__all__ = ["HeadReport", "ExtractionReport", "ExtractedConv", "conv_from_attention", "folded_value_matrices",
           "folded_bias", "interior_mask", "output_errors", "ASSIGNMENTS"]

#: Accepted values of ``assignment``.
ASSIGNMENTS = ("optimal", "nearest")


def folded_value_matrices(layer: PositionalAttention) -> torch.Tensor:
    """The folded value matrices of Lemma 1, ``W^(h) = W_val^(h) W_out[block h]``: ``(N_h, C_in, C_out)``.

    With full-width heads (no ``value_in``) ``W^(h) = value.weight[:, h*D:(h+1)*D]^T``; with a value
    projection ``W^(h) = value_in.weight[block h]^T value.weight[:, block h]^T`` (rank <= D_h).
    """
    nh, dh = layer.num_heads, layer.head_dim
    w_out = layer.value.weight.detach().reshape(layer.out_dim, nh, dh).permute(1, 2, 0)     # (N_h, D_h, C_out)
    if layer.value_in is None:
        return w_out
    w_in = layer.value_in.weight.detach().reshape(nh, dh, layer.dim).transpose(1, 2)        # (N_h, C_in, D_h)
    return w_in @ w_out


def folded_bias(layer: PositionalAttention) -> torch.Tensor:
    """Output bias ``(C_out,)``: ``value.bias`` plus, with a value projection, ``sum_h b_in^(h) W_out[block h]``.

    The second term is exact because each head's probabilities sum to 1 over the keys.
    """
    bias = layer.value.bias.detach().clone()
    if layer.value_in is not None:
        nh, dh = layer.num_heads, layer.head_dim
        w_out = layer.value.weight.detach().reshape(layer.out_dim, nh * dh)
        bias = bias + w_out @ layer.value_in.bias.detach()
    return bias


def interior_mask(in_size: tuple[int, ...], *, pad: int, stride: int, padding: str) -> torch.Tensor:
    """Output positions whose receptive field lies inside the input (no padding read): bool ``out_size``.

    Args:
        in_size: input spatial size, ``(H, W)`` or ``(T,)``.
        pad: kernel reach ``(K // 2) * dilation`` (tokens).
        stride: output stride.
        padding: ``"same"`` or ``"valid"`` (then every output position is interior).
    """
    axes = []
    for n in in_size:
        if padding == "valid":
            centers = torch.arange(pad, n - pad, stride)
        else:
            centers = torch.arange(0, n, stride)
        axes.append((centers >= pad) & (centers <= n - 1 - pad))
    mask = axes[0]
    for a in axes[1:]:
        mask = mask[..., None] & a
    return mask


def output_errors(out: torch.Tensor, ref: torch.Tensor, interior: torch.Tensor | None = None) -> dict:
    """Max absolute and relative errors of ``out`` against ``ref`` (channels-last, same shape).

    Relative errors divide by ``max |ref|`` over all positions (one denominator for all three).

    Returns:
        ``{"max_abs": {"all", "interior", "border"}, "relative": {...}, "max_abs_reference": float}``;
        a region with no position is ``None``.

    Raises:
        ValueError: shapes differ.
    """
    if out.shape != ref.shape:
        raise ValueError(f"outputs differ in shape: {tuple(out.shape)} vs {tuple(ref.shape)}")
    diff = (out.detach() - ref.detach()).abs().amax(dim=-1).amax(dim=0).double()     # (spatial...)
    scale = ref.detach().abs().max().double().item()
    regions = {"all": torch.ones_like(diff, dtype=torch.bool)}
    if interior is not None:
        regions.update(interior=interior, border=~interior)
    max_abs = {k: (diff[m].max().item() if m.any() else None) for k, m in regions.items()}
    relative = {k: (None if v is None else (v / scale if scale > 0 else (0.0 if v == 0 else math.inf)))
                for k, v in max_abs.items()}
    return {"max_abs": max_abs, "relative": relative, "max_abs_reference": scale}


@dataclass
class HeadReport:
    """One head of an attention layer against the kernel grid.

    Attributes:
        head: head index.
        center: center of attention ``(row, col)`` in tokens.
        shift: assigned kernel shift ``(row, col)`` in tokens, or None (head left out).
        tap: kernel index ``(u, v)`` (1-D: ``(0, v)``) of that shift, or None.
        distance: Euclidean distance from ``center`` to ``shift`` (tokens), or None.
        alpha: sharpness (quadratic: ``s^2/2``; full covariance: half the smallest eigenvalue of
            Sigma^-1, the weakest direction); None for other encodings.
        target_mass: attention probability on the assigned shift for the reference query
            (the middle of the grid used), in [0, 1]; 1 means one-hot as in Lemma 1.
    """

    head: int
    center: tuple[float, float]
    shift: tuple[float, float] | None
    tap: tuple[int, int] | None
    distance: float | None
    alpha: float | None
    target_mass: float


@dataclass
class ExtractionReport:
    """How far an attention layer is from the extracted convolution.

    Attributes:
        kernel_size, dilation: the kernel grid.
        assignment: ``"optimal"`` or ``"nearest"``.
        grid: ``(H, W)`` grid used for centers of non-quadratic heads and for ``target_mass``.
        heads: one :class:`HeadReport` per head.
        max_center_distance: largest ``distance`` over assigned heads (tokens).
        errors: :func:`output_errors` of layer vs. extracted convolution on the given inputs (None
            without inputs). A bare layer is compared with the zero-padded "same" convolution, so
            its border differs by construction: read the ``interior`` entries.
    """

    kernel_size: int
    dilation: int
    assignment: str
    grid: tuple[int, int]
    heads: list[HeadReport]
    max_center_distance: float
    errors: dict | None = None

    @property
    def relative_error(self) -> float | None:
        """Max relative output error over all positions (None without inputs)."""
        return None if self.errors is None else self.errors["relative"]["all"]

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return asdict(self)


@dataclass
class ExtractedConv:
    """The extracted convolution.

    Attributes:
        weight: ``(C_out, C_in, K, K)`` (2-D) or ``(C_out, C_in, K)`` (1-D), PyTorch layout.
        bias: ``(C_out,)``.
        stride, dilation: ints; padding: ``"same"`` or ``"valid"``.
        report: :class:`ExtractionReport`.
    """

    weight: torch.Tensor
    bias: torch.Tensor
    stride: int
    dilation: int
    padding: str
    report: ExtractionReport = field(repr=False)

    @property
    def pad(self) -> int:
        return (self.weight.shape[-1] // 2) * self.dilation

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the convolution to channels-last input ``(B, H, W, C_in)`` or ``(B, T, C_in)``."""
        p = self.pad if self.padding == "same" else 0
        if self.weight.dim() == 3:
            return F.conv1d(x.transpose(1, 2), self.weight, self.bias, self.stride, p, self.dilation).transpose(1, 2)
        y = F.conv2d(x.permute(0, 3, 1, 2), self.weight, self.bias, self.stride, p, self.dilation)
        return y.permute(0, 2, 3, 1)


def _centers_and_alpha(layer: PositionalAttention, probs: torch.Tensor, query: int,
                       grid: tuple[int, int]) -> tuple[torch.Tensor, list[float | None]]:
    """Centers ``(N_h, 2)`` float64 and alphas of the heads."""
    if isinstance(layer, QuadraticAttention):
        centers = layer.centers.detach().double().cpu()
        if layer.full_covariance:
            eig = torch.linalg.eigvalsh(layer.inverse_covariance.detach().double().cpu())
            alphas = (eig[:, 0] / 2).tolist()
        else:
            alphas = layer.alpha.detach().double().cpu().tolist()
        return centers, alphas
    from ..layers import grid_positions
    pos = grid_positions(*grid, dtype=torch.float64)
    delta = pos - pos[query]                                                   # (N, 2)
    centers = probs[:, query].double().cpu() @ delta                           # (N_h, 2)
    return centers, [None] * layer.num_heads


def _assign(cost: torch.Tensor, assignment: str) -> list[int | None]:
    """Shift index per head (None: left out) minimising the total cost ``(N_h, S)``."""
    if assignment == "nearest":
        return cost.argmin(dim=1).tolist()
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(cost.numpy())
    out: list[int | None] = [None] * cost.shape[0]
    for r, c in zip(rows.tolist(), cols.tolist()):
        out[r] = c
    return out


def _unwrap(layer: AttentionConv2d | PositionalAttention,
            assignment: str) -> tuple[AttentionConv2d | None, PositionalAttention]:
    """``(wrapper or None, its position-only attention)``; checks both arguments of the extraction."""
    wrapper = layer if isinstance(layer, AttentionConv2d) else None
    attn = wrapper.attention if wrapper is not None else layer
    if not isinstance(attn, PositionalAttention):
        raise InputError(f"{type(attn).__name__} is not a position-only attention layer: its attention depends "
                         "on the input, so no single convolution describes it")
    if assignment not in ASSIGNMENTS:
        raise InputError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {assignment!r}")
    return wrapper, attn


def _kernel_size_and_dilation(attn: PositionalAttention, wrapper: AttentionConv2d | None,
                              kernel_size: int | None, dilation: int | None) -> tuple[int, int]:
    """K and the dilation: as given, else the wrapper's, else ``sqrt(N_h)`` (odd) and 1."""
    nh = attn.num_heads
    if kernel_size is None:
        kernel_size = wrapper.kernel_size if wrapper is not None else math.isqrt(nh)
        if wrapper is None and (kernel_size ** 2 != nh or kernel_size % 2 == 0):
            raise InputError(f"{nh} heads do not fill an odd K x K grid; pass kernel_size")
    if dilation is None:
        dilation = wrapper.dilation if wrapper is not None else 1
    return kernel_size, dilation


def _probe_grid(attn: PositionalAttention, inputs: torch.Tensor | None, grid: tuple[int, int] | None,
                dims: int, shifts: torch.Tensor) -> tuple[int, int]:
    """The ``(H, W)`` grid of the probabilities (and of the centers of learned encodings).

    As given; else the inputs' grid (checked here); else the learned tables' ``max_size`` square;
    else the smallest odd square (1-D: row) holding every shift and quadratic center, at most 65.
    """
    if inputs is not None:
        expect = 4 if dims == 2 else 3
        if inputs.dim() != expect or inputs.shape[-1] != attn.dim:
            raise InputError(f"inputs must be channels-last with {attn.dim} channels and {expect} axes, "
                             f"got {tuple(inputs.shape)}")
    if grid is None:
        if inputs is not None:
            grid = tuple(inputs.shape[1:3]) if dims == 2 else (1, inputs.shape[1])
        elif hasattr(attn, "max_size"):
            grid = (attn.max_size, attn.max_size)
        else:
            reach = shifts.abs().max().item()
            if isinstance(attn, QuadraticAttention):
                reach = max(reach, attn.centers.detach().abs().max().item())
            side = 2 * min(int(math.ceil(reach)) + 1, 32) + 1
            grid = (1, side) if dims == 1 else (side, side)
    return int(grid[0]), int(grid[1])


def _head_reports(probs: torch.Tensor, query: int, grid: tuple[int, int], centers: torch.Tensor,
                  alphas: list[float | None], assigned: list[int | None], shifts: torch.Tensor,
                  kernel_size: int, dims: int) -> list[HeadReport]:
    """One :class:`HeadReport` per head: its center, assigned shift and tap, distance, alpha, and the
    attention mass ``probs (N_h, N, N)`` puts on the assigned shift from token ``query``."""
    heads = []
    for h, s in enumerate(assigned):
        center = tuple(float(v) for v in centers[h])
        if s is None:
            heads.append(HeadReport(h, center, None, None, None, alphas[h], 0.0))
            continue
        shift = shifts[s]
        row, col = query // grid[1] + int(shift[0]), query % grid[1] + int(shift[1])
        inside = 0 <= row < grid[0] and 0 <= col < grid[1]
        mass = probs[h, query, row * grid[1] + col].item() if inside else 0.0
        tap = (s // kernel_size, s % kernel_size) if dims == 2 else (0, s)
        heads.append(HeadReport(h, center, (float(shift[0]), float(shift[1])), tap,
                                float(torch.linalg.vector_norm(centers[h] - shift)), alphas[h], mass))
    return heads


def _kernel_weight(attn: PositionalAttention, assigned: list[int | None], num_shifts: int, kernel_size: int,
                   dims: int) -> torch.Tensor:
    """The kernel ``(C_out, C_in, K, K)`` (1-D: ``(C_out, C_in, K)``): each head's folded value matrix
    ``W^(h)`` (Lemma 1) on the tap of its assigned shift; heads on the same shift add up."""
    w_heads = folded_value_matrices(attn)                                         # (N_h, C_in, C_out)
    taps = torch.zeros(num_shifts, attn.out_dim, attn.dim, dtype=w_heads.dtype, device=w_heads.device)
    for h, s in enumerate(assigned):
        if s is not None:
            taps[s] += w_heads[h].T
    if dims == 2:
        return taps.reshape(kernel_size, kernel_size, attn.out_dim, attn.dim).permute(2, 3, 0, 1).contiguous()
    return taps.permute(1, 2, 0).contiguous()


@torch.no_grad()
def conv_from_attention(layer: AttentionConv2d | PositionalAttention, *, kernel_size: int | None = None,
                        dilation: int | None = None, inputs: torch.Tensor | None = None,
                        grid: tuple[int, int] | None = None, assignment: str = "optimal") -> ExtractedConv:
    """The K x K convolution closest to a position-only attention layer, with a report (Theorem 1, converse).

    Args:
        layer: an :class:`~attncnn.theory.AttentionConv2d` / ``AttentionConv1d`` (its attention,
            kernel size, dilation, stride and padding are used), or a bare
            :class:`~attncnn.layers.PositionalAttention` (``QuadraticAttention`` isotropic or full
            covariance, ``LearnedRelativeAttention``), treated as a stride-1 "same" layer.
        kernel_size: K (odd); default ``sqrt(N_h)`` when that is an odd integer.
        dilation: spacing of the kernel grid in tokens (default the wrapper's, else 1).
        inputs: optional channels-last inputs ``(B, H, W, C_in)`` (1-D wrapper: ``(B, T, C_in)``)
            on which to measure the output error between the layer and the convolution.
        grid: ``(H, W)`` token grid used to find centers of non-quadratic heads and the attention
            mass on the assigned shift (reference query: ``(H//2, W//2)``). Default: the inputs' grid,
            else the learned tables' square, else the smallest odd square holding every center and shift.
        assignment: ``"optimal"`` (Hungarian assignment, one head per shift; with N_h != K^2 heads
            or shifts are left out) or ``"nearest"`` (each
            head to its nearest shift; heads on the same shift add up).

    Returns:
        :class:`ExtractedConv` with ``weight (C_out, C_in, K, K)`` (1-D: ``(C_out, C_in, K)``),
        ``bias (C_out,)`` and an :class:`ExtractionReport`.

    Raises:
        InputError: content-dependent attention, no valid kernel size, unknown ``assignment``,
            or inputs of the wrong shape.
        ModuleNotFoundError: ``assignment="optimal"`` without SciPy installed.
    """
    wrapper, attn = _unwrap(layer, assignment)
    dims = wrapper.spatial_dims if wrapper is not None else 2
    kernel_size, dilation = _kernel_size_and_dilation(attn, wrapper, kernel_size, dilation)
    shifts = kernel_shifts(kernel_size, dilation, spatial_dims=dims)              # (S, 2)
    grid = _probe_grid(attn, inputs, grid, dims, shifts)
    probs = attn.grid_probs(*grid)[0].double().cpu()                         # (N_h, N, N)
    query = (grid[0] // 2) * grid[1] + grid[1] // 2
    centers, alphas = _centers_and_alpha(attn, probs, query, grid)
    assigned = _assign(torch.cdist(centers, shifts) ** 2, assignment)             # cost (N_h, S)
    heads = _head_reports(probs, query, grid, centers, alphas, assigned, shifts, kernel_size, dims)

    stride = wrapper.stride if wrapper is not None else 1
    padding = wrapper.padding if wrapper is not None else "same"
    weight = _kernel_weight(attn, assigned, shifts.shape[0], kernel_size, dims)
    conv = ExtractedConv(weight, folded_bias(attn), stride, dilation, padding, report=None)  # type: ignore[arg-type]
    errors = None
    if inputs is not None:
        out = (wrapper or attn)(inputs)
        ref = conv(inputs)
        in_size = tuple(inputs.shape[1:3]) if dims == 2 else (inputs.shape[1],)
        errors = output_errors(out, ref, interior_mask(in_size, pad=conv.pad, stride=stride, padding=padding))
    distances = [hr.distance for hr in heads if hr.distance is not None]
    conv.report = ExtractionReport(kernel_size, dilation, assignment, grid, heads,
                                   max(distances) if distances else math.nan, errors)
    return conv
