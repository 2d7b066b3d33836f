"""``attncnn theorem`` end to end on real CIFAR-10 test images."""

from __future__ import annotations

import json

import pytest

from attncnn.cli import main


def _run(capsys, *argv):
    rc = main(["theorem", "--repeats", "1", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _json(capsys, cifar10_path, data_cache_dir, *argv):
    rc, out, err = _run(capsys, "--data", str(cifar10_path), "--data-dir", str(data_cache_dir), "--json", *argv)
    assert rc == 0, err
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1
    return json.loads(lines[0])


def test_default_run_is_exact_in_float64(capsys, cifar10, cifar10_path, data_cache_dir):
    r = _json(capsys, cifar10_path, data_cache_dir, "--images", "3")
    assert (r["kernel_size"], r["heads"], r["dtype"], r["padding"]) == (3, 9, "float64", "same")
    assert r["input_shape"] == [3, 32, 32, 3] and r["output_shape"] == [3, 32, 32, 16]
    for region in ("interior", "border", "all"):
        assert r["relative_error"][region] <= 1e-10
    assert r["alpha_is_default"] and r["lemma2"]["off_target_mass"] < 1e-300
    assert set(r["seconds"]) == {"build", "conv", "attention"}


def test_float32_strided_dilated_valid(capsys, cifar10, cifar10_path, data_cache_dir):
    r = _json(capsys, cifar10_path, data_cache_dir, "--images", "2", "--dtype", "float32", "--kernel", "5",
              "--dilation", "2", "--stride", "2", "--padding", "valid", "--out-channels", "4", "--in-channels", "5")
    assert r["output_shape"] == [2, 12, 12, 4] and r["in_channels"] == 5
    assert r["relative_error"]["all"] <= 1e-5
    assert r["relative_error"]["border"] is None                      # 'valid': every output is interior


def test_finite_alpha_error_is_under_the_lemma2_bound(capsys, cifar10, cifar10_path, data_cache_dir):
    r = _json(capsys, cifar10_path, data_cache_dir, "--images", "2", "--alpha", "4")
    assert r["alpha"] == pytest.approx(4.0) and not r["alpha_is_default"]
    assert 0 < r["max_abs_error"]["all"] <= r["lemma2"]["output_bound"]


@pytest.mark.slow
def test_checkpoint_first_layer(capsys, cifar10, cifar10_path, data_cache_dir, resnet_checkpoint):
    r = _json(capsys, cifar10_path, data_cache_dir, "--images", "2", "--conv-from", str(resnet_checkpoint))
    assert (r["in_channels"], r["out_channels"], r["kernel_size"], r["padding"]) == (3, 8, 3, "same")
    assert "model.conv1" in r["kernel"]
    assert r["relative_error"]["all"] <= 1e-10
    rc, _, err = _run(capsys, "--data", str(cifar10_path), "--conv-from", str(resnet_checkpoint), "--kernel", "5")
    assert rc == 2 and "contradicts" in err


def test_text_output_prints_the_table(capsys, cifar10, cifar10_path, data_cache_dir):
    rc, out, _ = _run(capsys, "--data", str(cifar10_path), "--data-dir", str(data_cache_dir), "--images", "2")
    assert rc == 0
    assert "| region | max abs error | relative to max abs conv |" in out
    for region in ("interior", "border", "all"):
        assert f"| {region} |" in out
    assert "Lemma 2" in out and "timings" in out


@pytest.mark.parametrize("argv, message", [
    (["--kernel", "4"], "odd"),
    (["--images", "0"], "--images"),
    (["--repeats", "0"], "--repeats"),
    (["--conv-from", "/nonexistent/ckpt.safetensors"], "no checkpoint"),
])
def test_bad_options_exit_2(capsys, cifar10_path, data_cache_dir, argv, message):
    rc, _, err = _run(capsys, "--data", str(cifar10_path), "--data-dir", str(data_cache_dir), *argv)
    assert rc == 2
    assert err.startswith("attncnn theorem: error:") and message in err


def test_without_data_it_loads_no_data_set_not_even_a_test_variable(capsys, monkeypatch, tmp_path):
    import attncnn.data

    asked = []

    def load_dataset(spec, **kwargs):
        asked.append(spec)
        raise attncnn.data.DataError(f"stop after choosing {spec}")

    monkeypatch.setenv("ATTNCNN_TEST_CIFAR10", str(tmp_path / "tests-only.zip"))
    monkeypatch.setattr(attncnn.data, "load_dataset", load_dataset)
    rc, out, err = _run(capsys, "--images", "1")
    assert rc == 0 and asked == [], err
    assert "1 random images (32, 32)" in out
    rc, _, err = _run(capsys, "--images", "1", "--data", "cifar10")      # named: loaded
    assert rc == 2 and asked == ["cifar10"] and "stop after choosing cifar10" in err
    with pytest.raises(SystemExit):
        main(["theorem", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    help_text = help_text.replace("- ", "-")                      # argparse may wrap at a hyphen
    assert "default: random standard-normal 32x32 images" in help_text and "ATTNCNN_TEST_CIFAR10" not in help_text
    # the description said "on real images" above a default of random ones
    assert "on real images" not in help_text and "seeded random ones by default (no download)" in help_text
    assert "--images IMAGES number of images, random or of --data (default 100)" in help_text


def test_without_data_random_images_need_no_download(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNCNN_DATA_DIR", str(tmp_path / "empty"))      # no archive anywhere
    rc, out, err = _run(capsys, "--images", "2", "--json")
    assert rc == 0, err
    r = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert r["images"].startswith("2 random images (32, 32)") and r["input_shape"] == [2, 32, 32, 3]
    assert r["relative_error"]["all"] <= 1e-10
    assert not (tmp_path / "empty").exists()                            # nothing was downloaded or cached
