"""The way in from Python: ``attncnn.pretrained`` / ``attncnn.load_model`` give a model that takes
images in [0, 1] and refuses anything else, and ``attncnn.attention_maps`` gives each layer's
probabilities and score terms from real activations."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import attncnn
from attncnn.analysis import attention_layers
from attncnn.analysis import attention_maps as analysis_maps
from attncnn.analysis import position_maps
from attncnn.data import CIFAR_MEAN, CIFAR_STD
from attncnn.api import PACKAGED_MODELS, pretrained_path
from attncnn.runs import load_model as load_network

RESULTS = Path(__file__).resolve().parents[2] / "results"
shipped = pytest.mark.skipif(not (RESULTS / "mini" / "learned-mini" / "seed0").is_dir(),
                             reason="no committed results/mini")


def _images(n: int = 3) -> torch.Tensor:
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@shipped
def test_the_documented_three_lines_run():
    snippet = textwrap.dedent(attncnn.__doc__.split("::", 1)[1].split("\n\n")[1])
    assert len(snippet.strip().splitlines()) == 3 and "attncnn.pretrained" in snippet
    scope: dict = {}
    exec(snippet, scope)                                           # noqa: S102 (our own docstring)
    maps = scope["maps"]
    assert len(maps) == 6 and maps[0].probs.shape == (1, 9, 256, 256)


@shipped
def test_a_shipped_model_classifies_images_in_0_1_as_its_network_does_normalised_ones():
    model = attncnn.pretrained("quadratic-mini", seed=1)
    assert isinstance(model, attncnn.Classifier) and not model.training
    assert model.name == "quadratic-mini seed 1" and model.classes[0] == "airplane" and len(model.classes) == 10
    images = _images()
    mean, std = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = model.network((images - mean) / std)
        assert torch.equal(model(images), expected)
        as_bytes = (images * 255).round().to(torch.uint8)
        assert torch.allclose(model(as_bytes), model.network((as_bytes.float() / 255 - mean) / std))
        assert torch.allclose(model(images[0]), expected[:1], atol=1e-5)     # one image (C, H, W)
    assert model.predict(images) == [model.classes[i] for i in expected.argmax(1).tolist()]


@shipped
def test_a_model_refuses_images_it_would_misread():
    model = attncnn.pretrained("learned-mini")
    images = _images()
    with pytest.raises(ValueError, match="look normalised already: give them to model.network"):
        model((images - 0.5) / 0.25)
    with pytest.raises(ValueError, match="divide by 255 or pass uint8"):
        model(images * 255)
    with pytest.raises(ValueError, match=r"must be \(B, 3, H, W\)"):
        model(images[:, :1])
    with pytest.raises(ValueError, match="float in \\[0, 1\\] or uint8"):
        model(images.long())
    # NaN slipped through the range check (every comparison with NaN is False) and came out "airplane"
    broken = images.clone()
    broken[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="images must be finite: 1 values are NaN or infinite"):
        model.predict(broken)
    with pytest.raises(ValueError, match=r"channels last\? images.permute\(0, 3, 1, 2\)"):
        model(images.permute(0, 2, 3, 1))
    with pytest.raises(ValueError, match=r"resampling overshoots \[0, 1\] a little \(bicubic\): clamp them"):
        model(images * 1.1 - 0.05)


@shipped
@pytest.mark.parametrize("name", ["quadratic-mini", "learned-mini", "resnet18-mini"])
def test_a_model_refuses_images_of_another_size_than_it_was_trained_on(name):
    """A 64x64 photo runs through the position-only and the fully convolutional networks alike and
    gets wrong answers (quadratic-mini: 28 % right against 66.5 % at 32x32); learned-mini's tables
    refused it with advice about max_size that a user of the trained model cannot follow."""
    model = attncnn.pretrained(name)
    assert model.image_size == (32, 32) and "image_size=32x32" in repr(model)
    large = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    for images in (large, (large * 255).to(torch.uint8), large[0], large[..., :32]):
        with pytest.raises(ValueError, match=rf"{name} seed 0 was trained on 32x32 images \(height x width\), got "
                                             rf"{images.shape[-2]}x{images.shape[-1]}; .* Resize them to 32x32 first, "
                                             r"or pass resize=True") as err:
            model.predict(images)
        assert "max_size" not in str(err.value)
    assert model(_images(2)).shape == (2, 10)                                  # the training size goes through


@shipped
def test_resizing_to_the_training_size_is_asked_for_and_done_as_stated():
    model = attncnn.pretrained("learned-mini")
    large = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        resized = F.interpolate(large, size=(32, 32), mode="bilinear", antialias=True)
        assert torch.allclose(model(large, resize=True), model(resized), atol=1e-6)
        assert torch.allclose(model(large, resize="bilinear"), model(resized), atol=1e-6)
        assert torch.equal(model(large, resize="nearest"), model(large[..., ::2, ::2]))    # every other pixel
        assert torch.equal(model.preprocess(large[..., :32, :32], resize=True),             # the right size: as it is
                           model.preprocess(large[..., :32, :32]))
    assert model.predict(large, resize=True) == model.predict(resized)
    with pytest.raises(ValueError, match="resize must be False, True or one of bilinear, bicubic, area, nearest"):
        model(large, resize="lanczos")


def test_a_bare_network_is_checked_against_the_size_it_is_given():
    network = attncnn.build_model("demo", num_classes=3).eval()
    assert attncnn.Classifier(network).image_size is None                    # nothing known: any size goes
    assert attncnn.Classifier(network)(torch.rand(1, 3, 48, 48)).shape == (1, 3)
    with pytest.raises(ValueError, match="the size of its training images is not known"):
        attncnn.Classifier(network)(torch.rand(1, 3, 48, 48), resize=True)
    sized = attncnn.Classifier(network, image_size=32)
    assert sized.image_size == (32, 32)
    with pytest.raises(ValueError, match=r"model was trained on 32x32 images \(height x width\), got 48x48"):
        sized(torch.rand(1, 3, 48, 48))
    assert sized(torch.rand(1, 3, 48, 48), resize="bicubic").shape == (1, 3)
    images = torch.rand(1, 3, 32, 32, requires_grad=True)      # the input checks keep gradients (saliency maps)
    sized(images).sum().backward()
    assert images.grad is not None and images.grad.abs().sum() > 0
    # checkpoints written before the size was recorded: known from the data set where it is CIFAR
    training_image_size = attncnn.api.classifier.training_image_size
    assert training_image_size({"config": {"data": "cifar100"}}) == (32, 32)
    assert training_image_size({"dataset": "image zip x.zip (CIFAR-10 classes)"}) == (32, 32)
    assert training_image_size({"dataset": "image folder /data/CIFAR-10-upscaled"}) is None
    assert training_image_size({"image_size": [64, 48], "config": {"data": "cifar10"}}) == (64, 48)
    with pytest.raises(ValueError, match="image_size must be positive"):
        attncnn.Classifier(network, image_size=(0, 32))


@shipped
def test_load_model_takes_a_folder_or_a_checkpoint_a_device_and_a_dtype():
    folder = RESULTS / "mini" / "learned-mini" / "seed0"
    model = attncnn.load_model(folder, dtype=torch.float64)
    assert next(model.parameters()).dtype == torch.float64 and model.source.name == "last.safetensors"
    network, meta = load_network(folder)                            # the training API keeps its (model, meta)
    assert meta["classes"] == list(model.classes) and not network.training
    images = _images(2)
    with torch.no_grad():
        assert model(images).dtype == torch.float64
        assert torch.allclose(model(images).float(), attncnn.load_model(folder / "checkpoints" /
                                                                        "last.safetensors")(images), atol=1e-4)
    with pytest.raises(ValueError, match="floating dtype"):
        attncnn.load_model(folder, dtype=torch.int64)


@shipped
def test_pretrained_lists_what_it_has_and_names_where_it_looked(tmp_path, monkeypatch):
    found = attncnn.list_pretrained()
    presets = [item for item in found if "/" not in item[0]]
    assert found[:len(presets)] == sorted(presets)          # the presets' own runs first, in name order
    assert {("learned", 0), ("learned-content-mini", 0), ("learned-mini", 0), ("learned-mini", 1)} <= set(presets)
    assert ("efficiency/gpsa-mini/10pct", 1) in found
    assert attncnn.pretrained("efficiency/gpsa-mini/10pct", seed=1).name == "gpsa-mini seed 1"
    with pytest.raises(FileNotFoundError) as err:
        attncnn.pretrained("quadratic-mini", seed=7)
    message = str(err.value)
    assert f"Looked for <suite>/quadratic-mini/seed7 and quadratic-mini/seed7 in {RESULTS}, " in message
    assert "'quadratic-mini' is there with seeds 0, 1, 2." in message and "quadratic-mini seed 2" in message
    with pytest.raises(FileNotFoundError) as err:                # root= is the only place looked in
        attncnn.pretrained("quadratic-mini", root=tmp_path)
    message = str(err.value)                                        # ... and the three ways to get a model
    assert message.startswith("no trained model 'quadratic-mini' seed 0. Looked for <suite>/quadratic-mini/seed0 "
                              f"and quadratic-mini/seed0 in {tmp_path}. No trained model is there.")
    assert ("No trained model is there. A trained model comes one of three ways: with the installed package (the "
            "60-epoch mini models: learned-content-mini, learned-mini, quadratic-generalized-mini, quadratic-mini, "
            "resnet18-mini); from a clone of the repository") in message
    assert "root='<clone>/results' or set ATTNCNN_RESULTS=<clone>/results" in message
    assert "`attncnn download NAME --from URL_OR_FOLDER` (NAME: learned, quadratic, " in message
    with pytest.raises(ValueError, match="a preset such as 'quadratic-mini'"):
        attncnn.pretrained("../mini/quadratic-mini")
    # a results folder elsewhere, named by the environment variable, instead of the clone's; the
    # packaged models are still there, and the results folder wins even with a shorter run
    shutil.copytree(RESULTS / "mini" / "resnet18-mini" / "seed0", tmp_path / "mini" / "resnet18-mini" / "seed0")
    monkeypatch.setenv("ATTNCNN_RESULTS", str(tmp_path))
    packaged = [("learned-content-mini", 0), ("learned-mini", 0), ("quadratic-generalized-mini", 0),
                ("quadratic-mini", 0), ("resnet18-mini", 0), ("mini-long/resnet18-mini", 0)]
    assert attncnn.list_pretrained() == packaged
    assert attncnn.pretrained("resnet18-mini").source.is_relative_to(tmp_path)
    assert pretrained_path("quadratic-mini") == PACKAGED_MODELS / "mini-long" / "quadratic-mini" / "seed0"
    # an unfinished run (shipped with its resumable checkpoint to be continued) is not offered
    unfinished = tmp_path / "mini-long" / "resnet18-mini" / "seed0"
    shutil.copytree(RESULTS / "mini" / "resnet18-mini" / "seed0", unfinished)
    (unfinished / "finished.json").unlink()
    assert attncnn.list_pretrained() == packaged
    assert pretrained_path("mini-long/resnet18-mini") == PACKAGED_MODELS / "mini-long" / "resnet18-mini" / "seed0"
    with pytest.raises(FileNotFoundError, match="no trained model 'mini/resnet18-mini' seed 3"):
        attncnn.pretrained("mini/resnet18-mini", seed=3)


@shipped
def test_a_missing_model_is_answered_with_what_is_there_and_how_to_get_it(tmp_path):
    shutil.copytree(RESULTS / "mini" / "resnet18-mini" / "seed0", tmp_path / "mini" / "resnet18-mini" / "seed0")

    def message(name, seed=0):
        with pytest.raises(FileNotFoundError) as err:
            attncnn.pretrained(name, seed, root=tmp_path)
        return str(err.value)

    # a preset with no run there: the run of its family that is there, and the command that trains it
    text = message("resnet18")
    assert "Closest there: resnet18-mini (seed 0)." in text
    assert "'resnet18' is a preset none of whose finished runs is there" in text
    assert "attncnn train --preset resnet18`" in text and "No trained model is there" not in text
    assert text.endswith("`attncnn download resnet18 --from URL_OR_FOLDER` from a copy of a clone's results/ folder, "
                         "local or served over http(s).")
    # another seed of a model that is there: its seeds, no training advice
    text = message("resnet18-mini", seed=4)
    assert "'resnet18-mini' is there with seed 0." in text and "is a preset" not in text
    # a misspelling: the near name, and nothing about presets (it is none)
    text = message("resnet18-mimi")
    assert "Closest there: resnet18-mini (seed 0)." in text and "is a preset" not in text
    assert "Found there: resnet18-mini seed 0. A trained model comes one of three ways" in text
    assert "`attncnn download NAME --from URL_OR_FOLDER` (NAME: learned, quadratic" in text
    # a network trained only inside a study's folders: those runs first
    for cell in ("10pct", "100pct"):
        shutil.copytree(RESULTS / "efficiency-scarce" / "deit-mini" / cell / "seed0",
                        tmp_path / "efficiency-scarce" / "deit-mini" / cell / "seed0")
    text = message("deit-mini")
    assert ("Closest there: efficiency-scarce/deit-mini/100pct (seed 0), efficiency-scarce/deit-mini/10pct "
            "(seed 0)") in text and "is a preset" not in text


@shipped
def test_maps_of_a_position_only_model_need_no_image():
    model = attncnn.pretrained("quadratic-mini")
    maps = attncnn.attention_maps(model)
    reference = position_maps(model.network)
    assert len(maps) == 6
    for got, want in zip(maps, reference):
        assert got.position_only and (got.height, got.width) == (16, 16)
        assert torch.equal(got.probs, want.probs) and got.content is None
        assert torch.allclose(torch.softmax(got.positional, -1), got.probs, atol=1e-6)   # the whole score
    assert attncnn.attention_maps(model, _images(2))[0].probs.equal(maps[0].probs)       # the same with images
    picked = attncnn.attention_maps(model, queries=[0, 17])
    assert picked[2].probs.shape == (1, 9, 2, 256) and picked[2].probs.equal(maps[2].probs[:, :, [0, 17]])
    for wrong in ([-1], [256]):                 # -1 would pick the last token, 256 fail inside with an IndexError
        with pytest.raises(ValueError, match=r"queries must be token indices r \* W \+ c in \[0, 256\)"):
            attncnn.attention_maps(model, queries=wrong)


def _layer_inputs(model, images) -> list[torch.Tensor]:
    """Each attention layer's input during an ordinary forward pass of ``images`` (in [0, 1])."""
    inputs, handles = [], [layer.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
                           for layer in attention_layers(model.network)]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for handle in handles:
            handle.remove()
    return inputs


@shipped
@pytest.mark.parametrize("name", ["learned-content-mini", "efficiency/gpsa-mini/10pct"])
def test_maps_of_a_content_model_are_each_layers_own_probabilities_on_its_real_input(name):
    model = attncnn.pretrained(name)
    images = _images(2)
    maps = attncnn.attention_maps(model, images)
    layers = attention_layers(model.network)
    for got, layer, x in zip(maps, layers, _layer_inputs(model, images), strict=True):
        with torch.no_grad():
            _, probs = layer(x, return_attention=True)       # the layer's explicit path on the input it was given
        assert torch.equal(got.probs, probs.expand_as(got.probs))
    # a 64x64 image is refused, or resized as the model resizes it
    large = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match=r"attncnn.attention_maps\(model, images, resize=True\)"):
        attncnn.attention_maps(model, large)
    resized = attncnn.attention_maps(model, large, resize=True, scores=False)
    small = F.interpolate(large, size=(32, 32), mode="bilinear", antialias=True).clamp(0, 1)   # as resize=True does
    assert torch.equal(resized[0].probs, attncnn.attention_maps(model, small, scores=False)[0].probs)


@shipped
def test_maps_of_a_content_model_come_from_real_activations_with_both_score_terms():
    model = attncnn.pretrained("learned-content-mini")
    images = _images(2)
    maps = attncnn.attention_maps(model, images)
    hooked = analysis_maps(model.network, model.preprocess(images))
    for got, want in zip(maps, hooked):
        assert got.probs.shape == (2, 9, 256, 256) and torch.equal(got.probs, want.probs)
        # the probabilities are the softmax of the two terms' sum (paper eq. 8: q.k + q.r)
        assert torch.allclose(torch.softmax(got.content + got.positional, -1), got.probs, atol=1e-5)
    averaged = attncnn.attention_maps(model, images, average=True, scores=False)
    assert averaged[0].probs.shape == (1, 9, 256, 256) and averaged[0].content is None
    assert torch.allclose(averaged[3].probs[0], maps[3].probs.mean(0), atol=1e-6)
    with pytest.raises(ValueError, match="depends on the image: pass images"):
        attncnn.attention_maps(model)


def test_maps_of_a_bare_network_and_what_has_no_attention():
    torch.manual_seed(0)
    network = attncnn.build_model("demo", num_classes=3).eval()
    normalised = torch.randn(2, 3, 32, 32)
    maps = attncnn.attention_maps(network, normalised)               # a bare network takes normalised images
    assert [m.probs.shape for m in maps] == [(1, 4, 64, 64)] * 2
    with pytest.raises(ValueError, match="bare network takes normalised float images"):
        attncnn.attention_maps(network, (normalised > 0).to(torch.uint8))
    with pytest.raises(ValueError, match="no self-attention blocks"):
        attncnn.attention_maps(attncnn.Classifier(attncnn.build_model("resnet18-mini").eval()), _images(1))
    wrapped = attncnn.Classifier(network)
    assert wrapped.classes == ("0", "1", "2") and wrapped.name == "model"
