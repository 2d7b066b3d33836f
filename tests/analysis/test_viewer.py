"""`attncnn viewer`: the exported page decodes back to the maps of real activations, to the
quantisation tolerance of each encoding (attncnn.analysis.viewer.encoding docstring), needs nothing
outside the file, and fails clearly without leaving a half-written page."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from attncnn.analysis.maps import attention_maps
from attncnn.analysis.rollout import attention_rollout, model_rollout
from attncnn.analysis.metrics import quadratic_head_parameters
from attncnn.analysis.runs import ImageIndexError, open_run
from attncnn.analysis.runs import test_images as load_test_images
from attncnn.analysis.viewer import (PAGE_TEMPLATE, build_html, export_model, export_run, quantize_affine,
                                     quantize_scaled, quantize_separable, read_viewer, separate_axes, write_viewer)
from attncnn.cli import main
from attncnn.models import build_model
from viewer_oracle import page_maps

IMAGES = [0, 5]
AVERAGE = 4


@pytest.fixture(scope="module")
def pages(runs, tmp_path_factory) -> dict:
    """One page per tiny run (images 0 and 5, average of the first 4 test images)."""
    root = tmp_path_factory.mktemp("viewer")
    out = {}
    for name, path in runs.items():
        out[name] = write_viewer([path], root / f"{name}.html", indices=IMAGES, average=AVERAGE)
    return out


def _truth(run, kind: str, *, average: bool = False) -> list[np.ndarray]:
    """Per layer ``(B or 1, N_h, N, N)`` float64 from attention_maps on the same test images."""
    indices = list(range(AVERAGE)) if average else IMAGES
    images, _ = load_test_images(run, indices)
    return [m.probs.double().numpy() for m in attention_maps(run.model, images, kind=kind, average=average)]


def _row_bound(data, run_index: int, image: str, kind: str, layer: int) -> np.ndarray:
    """The documented error bound of an encoded kind, per (head, query): step/2, step or scale/2."""
    info = data.manifest["runs"][run_index]
    entry = next(e for e in info["images"] if e["key"] == image)
    chosen = info["sets"][entry["set"]]
    enc = chosen["maps"][kind][layer]
    arrays = data.arrays(chosen["blob"])
    if enc["enc"] == "affine8":
        return arrays[enc["step"]].astype(np.float64) / 2
    if enc["enc"] == "scaled8":
        return arrays[enc["scale"]].astype(np.float64) / 2
    return arrays[enc["step"]].astype(np.float64)          # separable8: two roundings


def _assert_within(decoded, truth, bound):
    # slack: float32 rounding of the stored offsets and of the model's own float32 values
    error = np.abs(decoded - truth)
    slack = 1e-6 * (1 + np.abs(truth))
    assert (error <= bound[..., None] + slack).all(), f"max excess {(error - bound[..., None]).max():.3g}"


@pytest.mark.parametrize("name", ["quadratic", "generalized", "learned"])
def test_position_only_page_decodes_to_the_model_maps(runs, pages, name):
    run = open_run(runs[name])
    data = read_viewer(pages[name])
    info = data.manifest["runs"][0]
    assert info["position_only"]
    assert info["kinds"] == {"all": True, "positional": True, "content": False, "rollout": True}
    assert len(info["sets"]) == 1 and [e["key"] for e in info["images"]] == ["0", "5"]   # no average: input-free
    probs, scores = _truth(run, "probs"), _truth(run, "scores")
    for image in ("0", "5"):
        shown = page_maps(data, 0, image, "all", softmax=True)
        raw = page_maps(data, 0, image, "positional", softmax=False)
        for layer in range(len(probs)):
            _assert_within(shown[layer], probs[layer][0], _row_bound(data, 0, image, "probs", layer))
            _assert_within(raw[layer], scores[layer][0], _row_bound(data, 0, image, "scores", layer))
    with pytest.raises(ValueError, match="no 'content'"):
        page_maps(data, 0, "0", "content")
    rollout = [m.probs.double().numpy() for m in model_rollout(run.model, grid_size=tuple(info["grid"]))]
    shown = page_maps(data, 0, "5", "rollout", softmax=False)
    for layer in range(len(rollout)):
        _assert_within(shown[layer], rollout[layer][0], _row_bound(data, 0, "5", "rollout", layer))


def test_content_page_decodes_to_the_model_maps(runs, pages):
    run = open_run(runs["content"])
    data = read_viewer(pages["content"])
    info = data.manifest["runs"][0]
    assert info["kinds"] == {"all": True, "positional": True, "content": True, "rollout": True}
    assert [e["key"] for e in info["images"]] == ["0", "5", "average"] and info["average"] == AVERAGE
    # the learned q.r term is stored as a row term plus a column term
    assert {enc["enc"] for s in info["sets"] for enc in s["maps"]["positional"]} == {"separable8"}
    content, positional, probs = _truth(run, "content"), _truth(run, "positional"), _truth(run, "probs")
    for b, image in enumerate(("0", "5")):
        shown_content = page_maps(data, 0, image, "content", softmax=False)
        shown_positional = page_maps(data, 0, image, "positional", softmax=False)
        shown_probs = page_maps(data, 0, image, "all", softmax=True)     # recomputed: softmax(q.k + q.r)
        for layer in range(len(content)):
            c_bound = _row_bound(data, 0, image, "content", layer)
            p_bound = _row_bound(data, 0, image, "positional", layer)
            _assert_within(shown_content[layer], content[layer][b], c_bound)
            _assert_within(shown_positional[layer], positional[layer][b], p_bound)
            # a score error of at most e per key changes each probability by at most p (exp(2e) - 1)
            e = c_bound + p_bound + 1e-6
            truth = probs[layer][b]
            assert (np.abs(shown_probs[layer] - truth) <= truth * np.expm1(2 * e)[..., None] + 1e-7).all()
            np.testing.assert_allclose(shown_probs[layer].sum(-1), 1.0, atol=1e-9)
    mean_probs, mean_content = _truth(run, "probs", average=True), _truth(run, "content", average=True)
    shown, shown_content = page_maps(data, 0, "average", "all"), page_maps(data, 0, "average", "content", False)
    for layer in range(len(mean_probs)):
        _assert_within(shown[layer], mean_probs[layer][0], _row_bound(data, 0, "average", "probs", layer))
        _assert_within(shown_content[layer], mean_content[layer][0], _row_bound(data, 0, "average", "content", layer))
    # rollout: one map per layer, per image and averaged, as attention_rollout gives it from the maps
    for image, indices in (("5", [5]), ("average", list(range(AVERAGE)))):
        images, _ = load_test_images(run, indices)
        truth = [r.mean(0).double().numpy() for r in attention_rollout(attention_maps(run.model, images))]
        shown = page_maps(data, 0, image, "rollout")
        for layer in range(len(truth)):
            assert shown[layer].shape == (1, *truth[layer].shape)
            _assert_within(shown[layer][0], truth[layer], _row_bound(data, 0, image, "rollout", layer)[0])


def test_page_references_nothing_outside_itself(pages):
    text = pages["content"].read_text(encoding="utf-8")
    # The embedded base85 blobs are data the page decodes, never markup: any short string (even
    # "url(") can occur in them by chance, so the checks read the page without them.
    blobs = re.findall(r'<script type="application/octet-stream" id="attncnn-blob-\d+">', text)
    assert blobs, "the page embeds its data as base85 <script> elements"
    text = re.sub(r'(<script type="application/octet-stream" id="attncnn-blob-\d+">)[^<]*</script>', r"\1</script>",
                  text)
    assert not re.search(r"https?://", text, re.IGNORECASE)
    # no element that loads anything: no <link>, <img>, <iframe>, src= or href= attributes, CSS imports or url()
    assert not re.search(r"<(link|img|iframe)\b|\s(src|href)\s*=\s*[\"']|@import|url\(", text, re.IGNORECASE)
    assert "DecompressionStream" in text and 'id="attncnn-manifest"' in text
    assert pages["content"].stat().st_size < 2_000_000              # tiny runs: a few hundred kB


def test_a_shared_page_names_the_data_set_without_local_paths(pages, tiny_data, runs):
    text = pages["content"].read_text(encoding="utf-8")
    assert str(tiny_data) not in text and str(runs["content"]) not in text and str(Path.home()) not in text
    shown = read_viewer(pages["content"]).manifest["runs"][0]["dataset"]
    assert re.fullmatch(rf"{tiny_data.name} \(sha256:[0-9a-f]{{12}}\)", shown)


def test_quadratic_centres_and_mass_ellipses(runs, pages):
    run = open_run(runs["generalized"])
    info = read_viewer(pages["generalized"]).manifest["runs"][0]
    checked = 0
    for layer, heads in zip(run.model.blocks, info["centers"]):
        params = quadratic_head_parameters(layer.attention)
        for h, head in enumerate(heads):
            np.testing.assert_allclose(head["center"], params["center"][h].numpy(), rtol=1e-12)
            inv = np.array(head["inv_cov"])
            for mass in (50, 90):
                ellipse = head["ellipses"][str(mass)]
                if ellipse is None:
                    continue
                r0, r1, angle = ellipse
                # the two ends of the axes (col = x, row = y) lie on d^T Sigma^-1 d = -2 ln(1 - mass)
                for radius, theta in ((r0, angle), (r1, angle + math.pi / 2)):
                    d = radius * np.array([math.sin(theta), math.cos(theta)])     # (row, col)
                    assert d @ inv @ d == pytest.approx(-2 * math.log(1 - mass / 100), rel=1e-6)
                checked += 1
    assert checked >= sum(len(heads) for heads in info["centers"])   # at least half the ellipses are bounded


def test_several_runs_share_one_page(runs, tmp_path):
    out = write_viewer([runs["content"], runs["quadratic"]], tmp_path / "both.html", indices=[1], average=2)
    data = read_viewer(out)
    names = [r["name"] for r in data.manifest["runs"]]
    assert names == ["learned-content seed 42", "demo seed 42"]        # "<preset> seed <seed>", not the folder
    blobs = [s["blob"] for r in data.manifest["runs"] for s in r["sets"]]
    assert blobs == list(range(len(data.blobs))) == [0, 1, 2]
    assert data.manifest["runs"][1]["centers"] is not None and data.manifest["runs"][0]["centers"] is None
    acc = data.manifest["runs"][0]["accuracy"]
    assert 0 <= acc["last"] <= 1 and acc["last_epoch"] == 2


def test_quantisers_meet_their_bounds():
    rng = np.random.default_rng(0)
    values = rng.normal(scale=5, size=(3, 7, 40))
    q, lo, step = quantize_affine(values)
    assert q.dtype == np.uint8 and np.abs(lo[..., None] + q * step.astype(np.float64)[..., None] - values).max() <= (
        step.max() / 2 + 1e-5)
    probs = np.exp(values) / np.exp(values).sum(-1, keepdims=True)
    q, scale = quantize_scaled(probs)
    assert (np.abs(q * scale[..., None].astype(np.float64) - probs) <= scale[..., None] / 2 + 1e-9).all()
    row, col = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 6))
    full = (row[..., :, None] + col[..., None, :]).reshape(2, 5, 24)
    parts = separate_axes(full, 4, 6)
    assert parts is not None
    q, lo, step = quantize_separable(*parts)
    rebuilt = lo[..., None] + step[..., None] * (q[..., :4, None].astype(float) + q[..., None, 4:]).reshape(2, 5, 24)
    assert (np.abs(rebuilt - full) <= step[..., None] + 1e-6).all()
    assert separate_axes(rng.normal(size=(2, 24)), 4, 6) is None
    const_q, _, const_step = quantize_affine(np.ones((2, 8)))       # constant rows: no division by zero
    assert (const_q == 0).all() and (const_step == 0).all()


def test_plain_content_model_has_no_positional_values():
    torch.manual_seed(0)
    model = build_model("learned-content", attention="content", num_layers=1, num_heads=2, dim=8, mlp_dim=8,
                        pooling=8).eval()
    raw = torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8)
    with pytest.raises(ValueError, match="one label and one raw image per image"):
        export_model(model, raw.float() / 255, raw[:1], labels=["a"])
    export = export_model(model, raw[:1].float() / 255, raw[:1], labels=["a"], average_images=raw.float() / 255,
                          average_raw=raw)
    export.manifest.update(name="plain", preset=None, attention="content", epoch=None, accuracy=None)
    data = read_viewer(build_html([export]))
    assert data.manifest["runs"][0]["kinds"] == {"all": True, "positional": False, "content": True, "rollout": True}
    with pytest.raises(ValueError, match="no 'positional'"):
        page_maps(data, 0, "a", "positional")
    truth = attention_maps(model, raw[:1].float() / 255)[0].probs.double().numpy()[0]
    e = _row_bound(data, 0, "a", "content", 0) + 1e-6
    assert (np.abs(page_maps(data, 0, "a", "all")[0] - truth) <= truth * np.expm1(2 * e)[..., None] + 1e-7).all()


def test_the_9ffaa_content_form_exports_both_score_terms():
    """learned-content-9ffaa's positional term (w.r, the same for every image) is shown beside its content term."""
    torch.manual_seed(0)
    model = build_model("learned-content-9ffaa", num_layers=1, num_heads=2, dim=8, mlp_dim=8, pooling=8).eval()
    raw = torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8)
    export = export_model(model, raw[:1].float() / 255, raw[:1], labels=["a"], average_images=raw.float() / 255,
                          average_raw=raw)
    export.manifest.update(name="9ffaa", preset=None, attention="learned-content-9ffaa", epoch=None, accuracy=None)
    data = read_viewer(build_html([export]))
    assert data.manifest["runs"][0]["kinds"] == {"all": True, "positional": True, "content": True, "rollout": True}
    images = raw[:1].float() / 255
    for kind in ("content", "positional"):
        truth = attention_maps(model, images, kind=kind)[0].probs.double().numpy()[0]
        _assert_within(page_maps(data, 0, "a", kind, softmax=False)[0], truth, _row_bound(data, 0, "a", kind, 0))
    truth = attention_maps(model, images)[0].probs.double().numpy()[0]
    e = _row_bound(data, 0, "a", "content", 0) + _row_bound(data, 0, "a", "positional", 0) + 1e-6
    assert (np.abs(page_maps(data, 0, "a", "all")[0] - truth) <= truth * np.expm1(2 * e)[..., None] + 1e-7).all()


def test_images_beyond_the_test_split_raise_a_typed_error(runs):
    with pytest.raises(ImageIndexError) as beyond:
        export_run(runs["content"], [0, 99, 120], average=2)
    assert isinstance(beyond.value, ValueError)
    assert (beyond.value.indices, beyond.value.count) == ([99, 120], 12)
    assert "--images 99,120: beyond the 12 test images" in str(beyond.value)
    with pytest.raises(ImageIndexError, match="--average 13 exceeds the 12 test images") as beyond:
        export_run(runs["content"], [0], average=13)
    assert beyond.value.indices == [12]


def test_every_file_of_the_page_is_package_data():
    """An installed (non-editable) attncnn must carry the template and every file it inlines."""
    from pathlib import Path

    import attncnn.analysis.viewer as viewer

    tomllib = pytest.importorskip("tomllib")                           # Python >= 3.11

    folder = Path(viewer.__file__).parent
    template = (folder / PAGE_TEMPLATE).read_text(encoding="utf-8")
    inlined = re.findall(r"/\*__ATTNCNN_INCLUDE ([\w.-]+)__\*/", template)
    assert sorted(inlined) == ["decode.js", "page.css", "page.js"]
    on_disk = sorted(p.name for p in folder.iterdir() if p.suffix in (".html", ".css", ".js"))
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    listed = pyproject["tool"]["setuptools"]["package-data"]["attncnn.analysis.viewer"]
    assert sorted(listed) == on_disk == sorted([PAGE_TEMPLATE, *inlined])


# -- the command -----------------------------------------------------------------------------------

def test_command_writes_the_page(runs, tmp_path, capsys):
    out = tmp_path / "v.html"
    assert main(["viewer", str(runs["learned"]), str(runs["content"]), "--images", "3,1,3", "--average", "5",
                 "--out", str(out), "--title", "tiny <runs>"]) == 0
    assert "v.html" in capsys.readouterr().out
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask                 # not mkstemp's private 0600
    data = read_viewer(out)
    assert data.manifest["title"] == "tiny <runs>" and "<title>tiny &lt;runs&gt;</title>" in out.read_text()
    assert [e["key"] for e in data.manifest["runs"][1]["images"]] == ["3", "1", "average"]


def _fails(argv, capsys, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("attncnn viewer: error:") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_command_errors_name_the_problem_and_leave_no_file(runs, tmp_path, capsys):
    out = tmp_path / "viewer.html"
    out.write_text("previous page")
    base = ["--out", str(out), "--average", "2"]
    _fails(["viewer", str(runs["content"]), "--images", "0,99", *base], capsys,
           "--images 99: beyond the 12 test images", "choose indices from 0 to 11")
    err = _fails(["viewer", str(runs["content"]), "--images", "0", "--average", "13", "--out", str(out)], capsys,
                 "--average 13 exceeds the 12 test images", "--average 12 or fewer")
    assert "14," not in err                                           # not a list of every missing index
    _fails(["viewer", str(tmp_path / "nowhere"), *base], capsys, "nowhere", "attncnn train --out")
    _fails(["viewer", str(runs["content"]), "--images", "a,b", *base], capsys, "2,3,19,56")
    _fails(["viewer", str(runs["content"]), "--out", str(tmp_path / "missing" / "v.html")], capsys,
           "does not exist", "--out")
    _fails(["viewer", str(runs["content"]), "--out", str(tmp_path)], capsys, "is a folder")
    assert out.read_text() == "previous page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["viewer.html"]        # no temporary files left


def test_command_rejects_a_resnet_run(tmp_path, capsys):
    from attncnn.runs import save_checkpoint

    model = build_model("resnet18")
    path = tmp_path / "resnet.safetensors"
    save_checkpoint(path, model=model, metadata={"arch": "resnet", "model_config": dataclasses.asdict(model.config)})
    _fails(["viewer", str(path), "--out", str(tmp_path / "v.html")], capsys, "no self-attention blocks",
           "quadratic, learned or content presets")
    assert not (tmp_path / "v.html").exists()

