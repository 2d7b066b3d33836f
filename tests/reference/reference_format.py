"""The reference code (epfml/attention-cnn at 9ffaa30) known by its facts only: its checkpoint's
tensor names and shapes, and its forward pass written out as plain float64 formulas.

Facts used (names, shapes, conventions; no code of the reference):
* ``BertImage``: NCHW images -> NHWC -> p x p space-to-depth with features ordered (dy, dx, c) ->
  ``features_upscale`` -> ``encoder.layer.i`` -> mean over tokens -> ``classifier``; buffer
  ``attention_mask`` (scalar 1.0, added to content scores).
* each layer: ``attention.self`` -> ``attention.output.dense`` -> + input -> ``attention.output.LayerNorm``;
  ``intermediate.dense`` -> GELU (erf) -> ``output.dense`` -> + input -> ``output.LayerNorm``;
  LayerNorm ``(x - mean) / sqrt(var + eps) * weight + bias`` (biased variance).
* Gaussian: ``attention_centers (N_h, 2)``, ``attention_spreads (N_h)`` or ``(N_h, 2, 2)``; for the
  shift d = key - query (component 0 along the grid's dim 1, the rows), score
  ``-1/2 (d - mu)^T Sigma^-1 (d - mu)`` with ``Sigma^-1 = s^2 I`` or ``S S^T``; ``value (D, N_h*D)``.
* learned: ``row_embeddings``/``col_embeddings`` ``(2M-1, E)``, ``head_keys_row``/``head_keys_col``
  ``(N_h, E)``, ``value``, buffer ``relative_indices (M, M)`` int64 ``[i, j] = j - i + M - 1``; its
  ``row_*`` score the shift along the grid's dim 2 (columns), its ``col_*`` along dim 1 (rows).
* learned + content (the same layer with ``use_attention_data``): the learned tensors and
  ``query``/``key`` ``(N_h*D, D)`` with bias, head h's coordinates ``h*D .. (h+1)*D - 1``; score
  ``head_keys_row . row_emb(column shift) + head_keys_col . col_emb(row shift) + q_h.k_h / sqrt(D)``
  (the positional part unscaled, no ``attention_mask``), softmax over every key, per image.
* content (``BertSelfAttention`` on the flattened grid): ``query``/``key``/``value`` ``(D, D)``,
  heads of width ``D / N_h``, scores ``q.k / sqrt(D / N_h) + attention_mask``, no map after the
  mix but ``attention.output.dense``.
"""

from __future__ import annotations

import math

import torch


def reference_config(kind: str, *, layers=2, heads=4, dim=8, mlp=6, pooling=2, max_position=16, width=-1,
                     dataset="Cifar10", **extra) -> dict:
    """A reference config.yaml's values for ``kind`` (quadratic, quadratic-generalized, learned,
    learned-content-9ffaa, content)."""
    flags = {"quadratic": (True, True, False), "quadratic-generalized": (True, False, False),
             "learned": (False, False, True), "learned-content-9ffaa": (False, False, True),
             "content": (False, False, False)}[kind]
    return {"dataset": dataset, "model": "bert", "optimizer": "SGD", "optimizer_cosine_lr": True,
            "optimizer_warmup_ratio": 0.05, "optimizer_decay_at_epochs": [80, 150, 250],
            "optimizer_decay_with_factor": 10.0, "optimizer_learning_rate": 0.1, "optimizer_momentum": 0.9,
            "optimizer_weight_decay": 0.0001, "batch_size": 100, "num_epochs": 300, "seed": 42,
            "hidden_size": dim, "position_encoding_size": width, "num_hidden_layers": layers,
            "num_attention_heads": heads, "intermediate_size": mlp, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "max_position_embeddings": max_position, "layer_norm_eps": 1e-12,
            "use_gaussian_attention": flags[0], "attention_isotropic_gaussian": flags[1],
            "use_learned_2d_encoding": flags[2], "use_attention_data": kind == "learned-content-9ffaa",
            "gaussian_init_sigma_std": 0.01,
            "gaussian_init_mu_std": 2.0, "attention_gaussian_blur_trick": False, "pooling_concatenate_size": pooling,
            "pooling_use_resnet": False, "num_keep_checkpoints": 30, "prune_degenerated_heads": False, **extra}


def reference_state(cfg: dict, classes: int = 10, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random ``model_state_dict`` of the reference's BertImage for ``cfg``, float32 (as it trains)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.3):
        return (torch.randn(*shape, generator=g) * scale).float()

    d, heads, mlp = cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]
    p = cfg["pooling_concatenate_size"]
    state = {"attention_mask": torch.tensor(1.0), "features_upscale.weight": rnd(d, 3 * p * p),
             "features_upscale.bias": rnd(d)}
    for i in range(cfg["num_hidden_layers"]):
        s = f"encoder.layer.{i}.attention.self."
        if cfg["use_gaussian_attention"]:
            state[s + "attention_centers"] = rnd(heads, 2, scale=1.5)
            state[s + "attention_spreads"] = (1 + rnd(heads) if cfg["attention_isotropic_gaussian"]
                                              else torch.eye(2) + rnd(heads, 2, 2))
            state[s + "value.weight"], state[s + "value.bias"] = rnd(d, heads * d), rnd(d)
        elif cfg["use_learned_2d_encoding"]:
            m, e = cfg["max_position_embeddings"], cfg["position_encoding_size"]
            e = d if e == -1 else e
            state[s + "relative_indices"] = torch.arange(m)[None, :] - torch.arange(m)[:, None] + m - 1
            for axis in ("row", "col"):
                state[s + f"{axis}_embeddings.weight"] = rnd(2 * m - 1, e, scale=1.0)
                state[s + f"head_keys_{axis}.weight"] = rnd(heads, e)
            if cfg["use_attention_data"]:
                for name in ("query", "key"):
                    state[s + f"{name}.weight"], state[s + f"{name}.bias"] = rnd(heads * d, d), rnd(heads * d)
            state[s + "value.weight"], state[s + "value.bias"] = rnd(d, heads * d), rnd(d)
        else:
            for name in ("query", "key", "value"):
                state[s + f"{name}.weight"], state[s + f"{name}.bias"] = rnd(d, d), rnd(d)
        o = f"encoder.layer.{i}."
        state[o + "attention.output.dense.weight"], state[o + "attention.output.dense.bias"] = rnd(d, d), rnd(d)
        state[o + "intermediate.dense.weight"], state[o + "intermediate.dense.bias"] = rnd(mlp, d), rnd(mlp)
        state[o + "output.dense.weight"], state[o + "output.dense.bias"] = rnd(d, mlp), rnd(d)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            state[o + norm + ".weight"], state[o + norm + ".bias"] = 1 + rnd(d, scale=0.1), rnd(d, scale=0.1)
    state["classifier.weight"], state["classifier.bias"] = rnd(classes, d), rnd(classes)
    return state


def _layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def _shifts(h: int, w: int) -> torch.Tensor:
    """``(N, N, 2)``: key position - query position, (row, column), tokens row-major."""
    pos = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2).double()
    return pos[None, :, :] - pos[:, None, :]


def _positional_scores(state: dict, s: str, cfg: dict, h: int, w: int) -> torch.Tensor:
    """``(N_h, N, N)`` scores of a Gaussian or learned layer, by the formulas in the module docstring."""
    d = _shifts(h, w)
    if cfg["use_gaussian_attention"]:
        mu, spreads = state[s + "attention_centers"], state[s + "attention_spreads"]
        inv = (spreads[:, None, None] ** 2 * torch.eye(2, dtype=torch.float64) if spreads.dim() == 1
               else spreads @ spreads.transpose(1, 2))
        diff = d[None] - mu[:, None, None, :]                                        # (N_h, N, N, 2)
        return -0.5 * torch.einsum("hqka,hab,hqkb->hqk", diff, inv, diff)
    m = cfg["max_position_embeddings"]
    rows, cols = d[..., 0].long(), d[..., 1].long()
    # the reference's "row" tables index the column shift, its "col" tables the row shift
    by_col = state[s + "row_embeddings.weight"][cols + m - 1] @ state[s + "head_keys_row.weight"].T   # (N, N, N_h)
    by_row = state[s + "col_embeddings.weight"][rows + m - 1] @ state[s + "head_keys_col.weight"].T
    return (by_col + by_row).permute(2, 0, 1)


def _attention(state: dict, s: str, cfg: dict, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``x (B, N, D) -> (B, N, D)``: the layer's attention.self (no output.dense yet)."""
    b, n, dim = x.shape
    heads = cfg["num_attention_heads"]
    if cfg["use_gaussian_attention"] or cfg["use_learned_2d_encoding"]:
        scores = _positional_scores(state, s, cfg, h, w)                             # (N_h, N, N)
        heads = scores.shape[0]
        if cfg["use_learned_2d_encoding"] and cfg["use_attention_data"]:
            def project(name):                                                       # (B, N_h, N, D)
                y = x @ state[s + f"{name}.weight"].T + state[s + f"{name}.bias"]
                return y.reshape(b, n, heads, dim).transpose(1, 2)

            content = project("query") @ project("key").transpose(-1, -2) / math.sqrt(dim)
            probs = torch.softmax(scores[None] + content, -1)                        # (B, N_h, N, N)
            mixed = torch.einsum("bhqk,bkd->bqhd", probs, x).reshape(b, n, heads * dim)
        else:
            probs = torch.softmax(scores, -1)
            mixed = torch.einsum("hqk,bkd->bqhd", probs, x).reshape(b, n, heads * dim)
        return mixed @ state[s + "value.weight"].T + state[s + "value.bias"]
    width = dim // heads

    def split(name):
        y = x @ state[s + f"{name}.weight"].T + state[s + f"{name}.bias"]
        return y.reshape(b, n, heads, width).transpose(1, 2)

    q, k, v = split("query"), split("key"), split("value")
    probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(width) + state["attention_mask"], -1)
    return (probs @ v).transpose(1, 2).reshape(b, n, dim)


def reference_forward(state: dict, cfg: dict, images: torch.Tensor) -> torch.Tensor:
    """Logits ``(B, classes)`` of the reference network ``state`` on normalised ``images (B, 3, H, W)``, float64."""
    state = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
    p, eps = cfg["pooling_concatenate_size"], cfg["layer_norm_eps"]
    x = images.double().permute(0, 2, 3, 1)
    b, hh, ww, c = x.shape
    h, w = hh // p, ww // p
    x = x.reshape(b, h, p, w, p, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h * w, p * p * c)     # (dy, dx, c)
    x = x @ state["features_upscale.weight"].T + state["features_upscale.bias"]
    for i in range(cfg["num_hidden_layers"]):
        o = f"encoder.layer.{i}."
        a = _attention(state, o + "attention.self.", cfg, x, h, w)
        a = a @ state[o + "attention.output.dense.weight"].T + state[o + "attention.output.dense.bias"]
        norm = o + "attention.output.LayerNorm."
        x = _layer_norm(a + x, state[norm + "weight"], state[norm + "bias"], eps)
        m = x @ state[o + "intermediate.dense.weight"].T + state[o + "intermediate.dense.bias"]
        m = m * 0.5 * (1.0 + torch.erf(m / math.sqrt(2.0)))
        m = m @ state[o + "output.dense.weight"].T + state[o + "output.dense.bias"]
        x = _layer_norm(m + x, state[o + "output.LayerNorm.weight"], state[o + "output.LayerNorm.bias"], eps)
    return x.mean(1) @ state["classifier.weight"].T + state["classifier.bias"]
