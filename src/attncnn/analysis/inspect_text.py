"""``attncnn inspect``'s text output: per-layer summaries and per-head rows, gates of GPSA layers included."""

from __future__ import annotations

__all__ = ["inspect_text"]


def inspect_text(result: dict) -> str:
    """The text table of ``attncnn inspect`` for :func:`~attncnn.analysis.metrics.model_metrics`'s result
    (plus ``run``, ``epoch``, ``kind`` and optionally ``checkpoint``, the file read): one line per layer,
    one row per head."""
    h, w = result["grid"]
    source = f"{result['images']} test images" if result["images"] else "position-only maps (input-independent)"
    lines = [f"{result['run']} (epoch {result['epoch']}, {result['kind']}): {h}x{w} token grid, {source}, "
             f"queries {'all' if not result['margin'] else 'at least %d from the border' % result['margin']}",
             "distance: mean attention distance in tokens (ViT Fig. 7), /side: the same over the grid side "
             f"{result['side']:g}; peak: mean max probability; entropy in nats, n.ent.: over log(H*W) "
             "(0 one-hot, 1 uniform)"]
    best = result["min_distance"]
    lines.append(f"most local head: layer {best['layer']} head {best['head']}, mean attention distance "
                 f"{best['distance']:.2f} tokens ({best['normalized_distance']:.3f} of the grid side)")
    if result.get("checkpoint"):
        lines.insert(1, f"checkpoint: {result['checkpoint']}")
    for layer in result["layers"]:
        grid = layer["grid"]
        extra = f", {layer['degenerate_heads']} degenerate" if "degenerate_heads" in layer else ""
        # GPSA (ConViT): sigmoid(lambda_h), the weight of the positional softmax in each head's mix.
        gated = "gate" in layer
        if gated:
            extra += f", mean gate {layer['gate']:.3f}"
        lines.append("")
        lines.append(f"layer {layer['layer']} ({layer['kind']}): distance {layer['distance']:.2f} "
                     f"(/side {layer['normalized_distance']:.3f}; most local head {layer['min_distance']:.2f}, "
                     f"{layer['local_heads']} of {layer['num_heads']} heads within 1.5 tokens), "
                     f"peak {layer['peak']:.3f}, entropy {layer['entropy']:.2f} "
                     f"(normalised {layer['normalized_entropy']:.3f}), distance to the nearest "
                     f"{grid['kernel_size']}x{grid['kernel_size']} grid {layer['grid_distance']:.3f} "
                     f"(centers from {layer['centers_from']}){extra}")
        quadratic = "center" in layer["heads"][0]
        header = f"  {'head':>4} {'distance':>8} {'/side':>6} {'peak':>6} {'entropy':>7} {'n.ent.':>6}"
        header += f"  {'center (row, col)':>18} {'spread':>22} {'degen.':>6}" if quadratic else \
            f"  {'mean shift (row, col)':>21}"
        if gated:
            header += f" {'gate':>6}"
        lines.append(header)
        for head in layer["heads"]:
            text = (f"  {head['head']:>4} {head['distance']:>8.2f} {head['normalized_distance']:>6.3f} "
                    f"{head['peak']:>6.3f} {head['entropy']:>7.2f} {head['normalized_entropy']:>6.3f}")
            if quadratic:
                center = "({:+.2f}, {:+.2f})".format(*head["center"])
                if "alpha" in head:
                    spread = f"alpha {head['alpha']:.3g}"
                else:
                    cond = head["condition_number"]
                    spread = "eig {:.2g}/{:.2g} k {}".format(*head["eigenvalues"],
                                                             "inf" if cond is None else f"{cond:.3g}")
                text += f"  {center:>18} {spread:>22} {'yes' if head['degenerate'] else '':>6}"
            else:
                text += "  {:>21}".format("({:+.2f}, {:+.2f})".format(*head["shift"]))
            if gated:
                text += f" {head['gate']:>6.3f}"
            lines.append(text)
    return "\n".join(lines)
