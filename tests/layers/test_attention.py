"""Every attention layer against a plain per-pair computation of the paper's formulas.

The layers compute on the ``device`` of tests/conftest.py (ATTNCNN_TEST_DEVICE); the per-pair
references compute on a CPU copy of the layer, in float64, and are moved to the layer's device."""

import copy
import math

import pytest
import torch

from attncnn.layers import (ATTENTION_KINDS, ContentAttention, GatedPositionalAttention, LearnedContent9ffaaAttention,
                            LearnedRelativeAttention, LearnedRelativeContentAttention, QuadraticAttention,
                            build_attention)

H, W, D, NH = 3, 4, 8, 3   # a small non-square grid


def _pos(n):
    return n // W, n % W


def _naive_softmax(scores):
    """Row-wise softmax of a python list of lists, in float64."""
    out = []
    for row in scores:
        m = max(row)
        e = [math.exp(s - m) for s in row]
        z = sum(e)
        out.append([v / z for v in e])
    return torch.tensor(out, dtype=torch.float64)


def _on_cpu(layer, x):
    """A float64 CPU copy of ``layer`` and ``x``, for the per-pair references."""
    return copy.deepcopy(layer).double().cpu(), x.detach().double().cpu()


def _naive_probs(layer, x):
    """(B or 1, N_h, N, N) from the per-pair formula of each layer, in float64, on ``x``'s device."""
    return _naive_probs_cpu(*_on_cpu(layer, x)).to(x.device)


def _naive_probs_cpu(layer, x):
    n = H * W
    if isinstance(layer, QuadraticAttention):
        out = []
        for h in range(layer.num_heads):
            c = layer.centers[h].tolist()
            rows = []
            for q in range(n):
                row = []
                for k in range(n):
                    (qi, qj), (ki, kj) = _pos(q), _pos(k)
                    dlt = torch.tensor([ki - qi - c[0], kj - qj - c[1]], dtype=torch.float64)
                    if layer.full_covariance:
                        s = layer.spreads[h].detach()
                        row.append(float(-0.5 * dlt @ (s @ s.T) @ dlt))
                    else:
                        alpha = float(layer.spreads[h].detach()) ** 2 / 2
                        row.append(-alpha * float(dlt @ dlt))
                rows.append(row)
            out.append(_naive_softmax(rows))
        return torch.stack(out)[None]
    if isinstance(layer, LearnedRelativeAttention):
        m = layer.max_size
        er, ec = layer.row_embeddings.weight, layer.col_embeddings.weight
        wr, wc = layer.head_keys_row.weight, layer.head_keys_col.weight
        out = []
        for h in range(layer.num_heads):
            rows = []
            for q in range(n):
                (qi, qj) = _pos(q)
                rows.append([float(wr[h] @ er[_pos(k)[0] - qi + m - 1] + wc[h] @ ec[_pos(k)[1] - qj + m - 1])
                             for k in range(n)])
            out.append(_naive_softmax(rows))
        return torch.stack(out)[None]
    if isinstance(layer, GatedPositionalAttention):
        return _naive_gpsa_probs(layer, x)
    # content layers
    b = x.shape[0]
    dh = layer.head_dim
    q = layer.query(x).reshape(b, n, layer.num_heads, dh)
    k = layer.key(x).reshape(b, n, layer.num_heads, dh)
    out = torch.empty(b, layer.num_heads, n, n, dtype=torch.float64)
    for bi in range(b):
        for h in range(layer.num_heads):
            rows = []
            for qi_ in range(n):
                row = []
                for ki_ in range(n):
                    s = float(q[bi, qi_, h] @ k[bi, ki_, h])
                    if isinstance(layer, LearnedRelativeContentAttention):
                        m, half = layer.max_size, dh // 2
                        (a, c), (e, f) = _pos(qi_), _pos(ki_)
                        s += float(q[bi, qi_, h, :half] @ layer.row_embeddings.weight[e - a + m - 1])
                        s += float(q[bi, qi_, h, half:] @ layer.col_embeddings.weight[f - c + m - 1])
                    if isinstance(layer, LearnedContent9ffaaAttention):   # q.k / sqrt(D) + w_row.e_row + w_col.e_col
                        m = layer.max_size
                        (a, c), (e, f) = _pos(qi_), _pos(ki_)
                        row.append(s / math.sqrt(layer.dim)
                                   + float(layer.head_keys_row.weight[h] @ layer.row_embeddings.weight[e - a + m - 1])
                                   + float(layer.head_keys_col.weight[h] @ layer.col_embeddings.weight[f - c + m - 1]))
                        continue
                    row.append(s / math.sqrt(dh))
                rows.append(row)
            out[bi, h] = _naive_softmax(rows)
    return out


def _naive_gpsa_probs(layer, x):
    """ConViT's GPSA per pair: ((1-g) softmax(q.k/sqrt(D_h)) + g softmax(v_pos . (d1, d2, d1^2+d2^2))) / sum."""
    b, n, dh = x.shape[0], H * W, layer.head_dim
    q = layer.query(x).reshape(b, n, layer.num_heads, dh)
    k = layer.key(x).reshape(b, n, layer.num_heads, dh)
    out = torch.empty(b, layer.num_heads, n, n, dtype=torch.float64)
    for h in range(layer.num_heads):
        v = layer.v_pos[h].tolist()
        g = 1.0 / (1.0 + math.exp(-float(layer.gate_logits[h])))
        positional = []
        for qi_ in range(n):
            (a, c) = _pos(qi_)
            positional.append([v[0] * (_pos(ki_)[0] - a) + v[1] * (_pos(ki_)[1] - c)
                               + v[2] * ((_pos(ki_)[0] - a) ** 2 + (_pos(ki_)[1] - c) ** 2) for ki_ in range(n)])
        pos = _naive_softmax(positional)
        for bi in range(b):
            content = _naive_softmax([[float(q[bi, qi_, h] @ k[bi, ki_, h]) / math.sqrt(dh) for ki_ in range(n)]
                                      for qi_ in range(n)])
            mixed = (1 - g) * content + g * pos
            out[bi, h] = mixed / mixed.sum(-1, keepdim=True)
    return out


def _make(kind, device="cpu", **kw):
    extra = {"max_size": 5} if kind.startswith("learned") else {}
    torch.manual_seed(0)
    layer = build_attention(kind, D, NH, **extra, **kw).eval()
    if isinstance(layer, QuadraticAttention):
        with torch.no_grad():   # centres near the grid, sharp enough for a non-trivial map
            layer.centers.copy_(torch.tensor([[0.0, 1.0], [-1.3, 0.4], [2.0, -2.5]]))
            layer.spreads.mul_(1.3)
    if isinstance(layer, GatedPositionalAttention):
        with torch.no_grad():   # a different gate per head, mostly content to mostly positional
            layer.gate_logits.copy_(torch.tensor([-1.5, 0.3, 2.0]))
    return layer.to(device)


def _randn(*shape, device, dtype=torch.float32):
    """Drawn on the CPU (the same numbers on every device), then moved."""
    return torch.randn(*shape, dtype=dtype).to(device)


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_probabilities_equal_naive_formula(kind, device):
    layer = _make(kind, device).double()
    x = _randn(2, H, W, D, dtype=torch.float64, device=device)
    _, probs = layer(x, return_attention=True)
    with torch.no_grad():
        expected = _naive_probs(layer, x)
    assert probs.shape == ((1 if layer.position_only else 2), NH, H * W, H * W)
    torch.testing.assert_close(probs, expected, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
@pytest.mark.parametrize("head_dim,out_dim", [(None, None), (6, 5)])
def test_output_equals_naive_mixture(kind, head_dim, out_dim, device):
    layer = _make(kind, device, head_dim=head_dim, out_dim=out_dim).double()
    x = _randn(2, H, W, D, dtype=torch.float64, device=device)
    out, probs = layer(x, return_attention=True)
    n = H * W
    tokens = x.reshape(2, n, D)
    if layer.value_in is None:
        values = [tokens for _ in range(NH)]
    else:
        v = layer.value_in(tokens).reshape(2, n, NH, layer.head_dim)
        values = [v[:, :, h] for h in range(NH)]
    heads = []
    for h in range(NH):
        p = probs[:, h]                                    # (B|1, N, N)
        heads.append(torch.einsum("bqk,bkd->bqd", p.expand(2, n, n), values[h]))
    expected = layer.value(torch.cat(heads, dim=-1)).reshape(2, H, W, layer.out_dim)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
@pytest.mark.parametrize("head_dim", [None, 4])
def test_fast_path_equals_explicit_path(kind, head_dim, device):
    layer = _make(kind, device, head_dim=head_dim)
    x = _randn(3, 5, 2, D, device=device)
    torch.testing.assert_close(layer(x), layer(x, return_attention=True)[0], rtol=1e-5, atol=1e-6)


def _naive_terms(layer, x):
    """(content, positional or None), each (B, N_h, N, N), pair by pair in float64: content
    q_h . k_h / sqrt(D_h) and positional (q_h[:D_h/2] . e_row(k_r - q_r) + q_h[D_h/2:] . e_col(k_c - q_c)) / sqrt(D_h);
    learned-content-9ffaa: q_h . k_h / sqrt(D) and w_row . e_row(k_r - q_r) + w_col . e_col(k_c - q_c).
    Computed on the CPU, returned on ``x``'s device."""
    content, positional = _naive_terms_cpu(*_on_cpu(layer, x))
    return content.to(x.device), None if positional is None else positional.to(x.device)


def _naive_terms_cpu(layer, x):
    b, n, dh, nh = x.shape[0], H * W, layer.head_dim, layer.num_heads
    tokens = x.reshape(b, n, D)
    q = [[layer.query(tokens[bi, t])[h * dh:(h + 1) * dh] for t in range(n)] for bi in range(b) for h in range(nh)]
    k = [[layer.key(tokens[bi, t])[h * dh:(h + 1) * dh] for t in range(n)] for bi in range(b) for h in range(nh)]
    content = torch.empty(b * nh, n, n, dtype=torch.float64)
    positional = torch.empty(b * nh, n, n, dtype=torch.float64)
    learned = isinstance(layer, LearnedRelativeContentAttention)
    keyed = isinstance(layer, LearnedContent9ffaaAttention)     # w.r, content over sqrt(D)
    for g in range(b * nh):
        for i in range(n):
            for j in range(n):
                content[g, i, j] = q[g][i] @ k[g][j] / math.sqrt(layer.dim if keyed else dh)
                if keyed:
                    (qr, qc), (kr, kc), m, h = _pos(i), _pos(j), layer.max_size, g % nh
                    e_row = layer.row_embeddings.weight[kr - qr + m - 1]
                    e_col = layer.col_embeddings.weight[kc - qc + m - 1]
                    positional[g, i, j] = layer.head_keys_row.weight[h] @ e_row + layer.head_keys_col.weight[h] @ e_col
                if learned:
                    (qr, qc), (kr, kc), m, half = _pos(i), _pos(j), layer.max_size, dh // 2
                    e_row = layer.row_embeddings.weight[kr - qr + m - 1]
                    e_col = layer.col_embeddings.weight[kc - qc + m - 1]
                    positional[g, i, j] = (q[g][i][:half] @ e_row + q[g][i][half:] @ e_col) / math.sqrt(dh)
    shape = (b, nh, n, n)
    return content.reshape(shape), positional.reshape(shape) if learned or keyed else None


@pytest.mark.parametrize("kind", ["content", "learned-content", "learned-content-9ffaa"])
@pytest.mark.parametrize("head_dim", [None, 6])
def test_score_terms_equal_naive_formula_and_add_up_to_the_scores(kind, head_dim, device):
    layer = _make(kind, device, head_dim=head_dim).double()
    x = _randn(2, H, W, D, dtype=torch.float64, device=device)
    with torch.no_grad():
        content, positional = layer.score_terms(x)
        expected_content, expected_positional = _naive_terms(layer, x)
        scores = layer.input_scores(x)
        q, _ = layer.queries_keys(x)
        direct = layer.positional_term(q, H, W)
    torch.testing.assert_close(content, expected_content, rtol=1e-12, atol=1e-12)
    assert layer.has_positional_term == (positional is not None) == kind.startswith("learned-content")
    if positional is None:
        assert direct is None
        torch.testing.assert_close(scores, content, rtol=1e-12, atol=1e-12)
    else:
        torch.testing.assert_close(positional, expected_positional, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(direct, positional, rtol=0, atol=0)
        torch.testing.assert_close(scores, content + positional, rtol=1e-12, atol=1e-12)


def test_position_only_probs_do_not_depend_on_input_or_batch(device):
    layer = _make("quadratic", device)
    _, p1 = layer(_randn(4, H, W, D, device=device), return_attention=True)
    _, p2 = layer(_randn(1, H, W, D, device=device), return_attention=True)
    assert p1.shape[0] == 1 and torch.equal(p1, p2)


def test_quadratic_eq9_dot_product_form_gives_same_probabilities(device):
    """Paper eq. (9): v = -alpha (1, -2 Delta_1, -2 Delta_2) dotted with r = (|d|^2, d_1, d_2)."""
    from attncnn.layers import quadratic_features
    layer = _make("quadratic", device).double()
    r = quadratic_features(H, W, device, dtype=torch.float64)                # (N, N, 3)
    a, c = layer.alpha, layer.centers
    v = -a[:, None] * torch.stack([torch.ones_like(a), -2 * c[:, 0], -2 * c[:, 1]], dim=-1)   # (N_h, 3)
    scores = torch.einsum("qkf,hf->hqk", r, v)
    torch.testing.assert_close(layer.grid_probs(H, W)[0], torch.softmax(scores, -1))


def test_generalized_five_feature_form_gives_same_probabilities(device):
    """PAPER.md 1.7: r = (d1, d2, d1^2, d2^2, d1 d2), v = ((S^-1 D)_1, (S^-1 D)_2, -a/2, -c/2, -b)."""
    from attncnn.layers import quadratic_features
    layer = _make("quadratic-generalized", device).double()
    with torch.no_grad():
        layer.spreads.add_(torch.tensor([[0.0, 0.4], [-0.3, 0.0]], dtype=torch.float64, device=device))
    inv = layer.inverse_covariance
    mu = torch.einsum("hij,hj->hi", inv, layer.centers)
    v = torch.stack([mu[:, 0], mu[:, 1], -inv[:, 0, 0] / 2, -inv[:, 1, 1] / 2, -inv[:, 0, 1]], dim=-1)
    scores = torch.einsum("qkf,hf->hqk", quadratic_features(H, W, device, dtype=torch.float64, generalized=True), v)
    torch.testing.assert_close(layer.grid_probs(H, W)[0], torch.softmax(scores, -1))


def test_quadratic_initialisation_matches_reference():
    torch.manual_seed(1)
    layer = QuadraticAttention(16, 400)          # many heads for statistics
    assert abs(layer.centers.std().item() - 2.0) < 0.15
    assert abs(layer.spreads.mean().item() - 1.0) < 0.002 and layer.spreads.std().item() < 0.02
    torch.testing.assert_close(layer.alpha, layer.spreads ** 2 / 2)
    full = QuadraticAttention(16, 50, full_covariance=True)
    assert (full.spreads - torch.eye(2)).abs().max() < 0.06
    assert layer.no_weight_decay() == {"centers", "spreads"}


def test_sharp_quadratic_head_is_one_hot_at_its_centre(device):
    layer = QuadraticAttention(D, 1).to(device)
    with torch.no_grad():
        layer.centers.copy_(torch.tensor([[1.0, -1.0]]))
        layer.spreads.fill_(20.0)                     # alpha = 200
    probs = layer.grid_probs(5, 5)[0, 0]
    q = 2 * 5 + 2                                    # centre token (2, 2)
    assert probs[q, 3 * 5 + 1] == 1.0                # key (3, 1) = query + (1, -1)
    assert probs[q].sum() == 1.0 and (probs[q] > 0).sum() == 1


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_rejects_wrong_shapes(kind):
    layer = _make(kind)
    with pytest.raises(ValueError, match=r"\(B, H, W, 8\)"):
        layer(torch.randn(2, H, W, D + 1))
    with pytest.raises(ValueError, match=r"\(B, H, W, 8\)"):
        layer(torch.randn(H, W, D))


def test_learned_tables_reject_grids_larger_than_max_size():
    layer = LearnedRelativeAttention(D, 2, max_size=4)
    layer(torch.randn(1, 4, 3, D))
    with pytest.raises(ValueError, match="max_size >= 5"):
        layer(torch.randn(1, 5, 3, D))


def test_learned_content_needs_even_head_dim():
    with pytest.raises(ValueError, match="even"):
        LearnedRelativeContentAttention(D, 2, head_dim=5)


def test_unknown_kind_lists_valid_names():
    with pytest.raises(ValueError, match="quadratic, quadratic-generalized, learned"):
        build_attention("gaussian", D, 2)


def test_content_attention_gradients_flow_through_fast_path(device):
    layer = ContentAttention(D, 2).train().to(device)
    x = _randn(2, H, W, D, device=device).requires_grad_()
    layer(x).sum().backward()
    assert x.grad is not None and layer.query.weight.grad.abs().sum() > 0


def test_flushing_tiny_probabilities_changes_outputs_by_less_than_1e6(device):
    """Probabilities below eps**2 are zeroed (no subnormal products on CPU); outputs barely move."""
    torch.manual_seed(0)
    layer = QuadraticAttention(D, 9).eval().to(device)
    with torch.no_grad():
        layer.spreads.fill_(2.0)                                   # alpha = 2: far keys ~ exp(-450)
    x = _randn(2, 16, 16, D, device=device)
    raw = torch.softmax(layer.grid_scores(16, 16), dim=-1)    # unflushed, (N_h, N, N)
    flushed = layer.grid_probs(16, 16)[0]
    assert ((raw > 0) & (flushed == 0)).sum() > 1000               # the flush really happened
    reference = layer.value((raw @ x.reshape(2, 1, 256, D)).transpose(1, 2).reshape(2, 256, 9 * D))
    out = layer(x).reshape(2, 256, D)
    assert ((out - reference).abs().max() / reference.abs().max()) < 1e-6
