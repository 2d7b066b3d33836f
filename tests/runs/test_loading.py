"""Models from files are checked on the meta device before any weight is allocated."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from attncnn.models import build_model
from attncnn.runs import load_checkpoint, load_model, save_checkpoint
from attncnn.runs.loading import build_checked, check_images, check_options_take_images

SMALL = {"attention": "quadratic", "dim": 16, "mlp_dim": 16, "num_layers": 2, "num_heads": 4, "pooling": 4}


def _checkpoint(path, **model_config_changes):
    model = build_model("demo", **SMALL)
    config = {**dataclasses.asdict(model.config), **model_config_changes}
    save_checkpoint(path, model=model, metadata={"arch": "image-transformer", "model_config": config})
    return path


def test_an_inflated_stored_configuration_is_refused_before_allocation_with_little_memory(tmp_path):
    bad = _checkpoint(tmp_path / "bad.safetensors", dim=400_000)
    # A fresh process, so that its peak resident memory measures this load alone (the model asked
    # for would need 5e12 bytes: allocating even a layer of it would show). VmHWM, not ru_maxrss:
    # Linux carries ru_maxrss over from the forking parent (this test process) through exec.
    code = ("import re, sys\nfrom attncnn.runs import load_model\n"
            "try:\n    load_model(sys.argv[1])\nexcept ValueError as err:\n    print(err)\n"
            "print(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1))\n")
    done = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=300)
    message, peak_kib = done.stdout.strip().splitlines()
    assert message.startswith(f"checkpoint {bad}: weight 'blocks.0.attention.value.bias' has shape (16,), "
                              "the configuration needs (400000,)")
    assert int(peak_kib) < 1_500_000, f"peak resident memory {int(peak_kib) / 1024:.0f} MiB"


def test_a_model_larger_than_memory_is_refused_without_a_checkpoint():
    with pytest.raises(ValueError, match=r"asks for a model of [\d,.]+ GiB of weights, more than the [\d,.]+ GiB "
                                         r"of memory on cpu \(model options: dim=400000, mlp_dim=16, num_layers=3"):
        build_checked("image-transformer", {**SMALL, "dim": 400_000, "num_layers": 3}, source="test")


def test_a_dtype_mismatch_is_named(tmp_path):
    path = _checkpoint(tmp_path / "ok.safetensors")
    model = build_model("demo", **SMALL).double()
    save_checkpoint(tmp_path / "f64.safetensors", model=model, metadata=load_checkpoint(path).metadata)
    with pytest.raises(ValueError, match=r"weight 'blocks.0.attention.centers' is torch.float64, the configuration "
                                         r"needs torch.float32"):
        load_model(tmp_path / "f64.safetensors")
    loaded, _ = load_model(path)
    stored = load_checkpoint(path).model_state
    assert stored.keys() == loaded.state_dict().keys()
    assert all(torch.equal(t, stored[name]) for name, t in loaded.state_dict().items())


def test_a_path_an_older_checkpoint_recorded_is_not_used_the_layers_rule_is(tmp_path):
    # an older run trained on a GPU recorded the paths it measured fastest there, paths this version no
    # longer has (FlexAttention's, the fused kernel on joint queries). A checkpoint holds no path now:
    # it is read one way
    small = {"dim": 32, "mlp_dim": 32, "num_layers": 2, "num_heads": 2, "pooling": 4}
    torch.manual_seed(0)
    trained = build_model("learned-content-mini", **small)
    config = {**dataclasses.asdict(trained.config), "impl": "flex", "eval_impl": "sdpa-onehot"}
    path = tmp_path / "gpu.safetensors"
    save_checkpoint(path, model=trained, metadata={"arch": "image-transformer", "model_config": config})
    before = path.read_bytes()
    loaded, meta = load_model(path, "cpu")
    assert not {"impl", "eval_impl"} & set(meta["model_config"]) and path.read_bytes() == before   # not rewritten
    layers = [m for m in loaded.modules() if hasattr(m, "eval_impl")]
    assert [(m.impl, m.eval_impl) for m in layers] == [("auto", None)] * 2
    x = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), trained.eval()(x), rtol=1e-5, atol=1e-5)


def test_check_images_refuses_what_the_network_refuses_with_its_own_fix_and_passes_the_rest():
    def meta(preset, **options):
        with torch.device("meta"):
            return build_model(preset, **options)

    with pytest.raises(ValueError, match=r"^learned-mini cannot take 3x48x48 images: grid height 24 exceeds the "
                                         r"learned table's max_size 16: build the layer with max_size >= 24"):
        check_images(meta("learned-mini"), (3, 48, 48), "learned-mini")
    check_images(meta("learned-mini", max_size=24), (3, 48, 48), "learned-mini")
    with pytest.raises(ValueError, match=r"cannot take 3x33x33 images: image size 33x33 is not divisible by the "
                                         r"pooling width 2"):
        check_images(meta("quadratic-mini"), (3, 33, 33))
    with pytest.raises(ValueError, match=r"cannot take 1x32x32 images: expected normalised images of shape "
                                         r"\(B, 3, H, W\)"):
        check_images(meta("quadratic-mini"), (1, 32, 32))
    # the path the network was built with is not what is checked (the dense path stands in), and it stays
    onehot = meta("learned-content-mini", impl="explicit-onehot")
    check_images(onehot, (3, 32, 32))
    assert {m.impl for m in onehot.modules() if hasattr(m, "eval_impl")} == {"explicit-onehot"} and onehot.training
    # a network with weights is not run (the check is for shapes-only builds)
    check_images(build_model("deit-mini"), (3, 16, 16))


def test_options_that_take_an_image_shape_are_checked_once_per_process(monkeypatch):
    from attncnn.runs import loading
    builds = []
    real = loading.build_model_from_config
    monkeypatch.setattr(loading, "build_model_from_config", lambda *a: builds.append(a) or real(*a))
    monkeypatch.setattr(loading, "_TAKEN", set())
    options = {**SMALL, "pooling": 2}
    for _ in range(2):
        check_options_take_images("image-transformer", options, (3, 16, 16))
    assert len(builds) == 1
    for _ in range(2):          # a refusal is not remembered: it is raised each time
        with pytest.raises(ValueError, match="cannot take 3x15x15 images: image size 15x15 is not divisible"):
            check_options_take_images("image-transformer", options, (3, 15, 15))
    assert len(builds) == 3
