import json
import subprocess
import sys

import pytest
import torch

from attncnn.cli import main
from attncnn.models import build_model, count_parameters
from attncnn.perf.bench.harness import bench_preset, count_training_flops, flops_per_image, time_median


def test_counted_flops_equal_the_analytic_count():
    """Quadratic model: 2 FLOPs per multiply-accumulate of every matrix product (harness convention)."""
    d, nh, mlp, layers, n, classes = 16, 4, 8, 2, 8 * 8, 10
    model = build_model("quadratic", num_layers=layers, num_heads=nh, dim=d, mlp_dim=mlp)
    x, y = torch.randn(2, 3, 16, 16), torch.tensor([0, 1])
    forward, train = count_training_flops(model, x, y)
    per_layer = nh * n * n * d + n * nh * d * d + n * d * d + 2 * n * d * mlp   # mix, value, dense, FFN
    expected = 2 * 2 * (n * 12 * d + layers * per_layer + d * classes)          # 2 images, 2 FLOPs/MAC
    assert forward == expected
    assert 2.5 * forward <= train <= 3 * forward       # backward: about 2x forward (no input grad at layer 1)


def test_the_folded_path_counts_the_dense_paths_flops():
    """With D_out = D the folded path runs the dense path's multiply-adds in another order; its
    backward's in-place head sum (addmm_, which FlopCounterMode does not know) is counted too."""
    x, y = torch.randn(2, 3, 16, 16), torch.tensor([0, 1])
    counts = {impl: count_training_flops(build_model("quadratic", num_layers=2, num_heads=4, dim=16, mlp_dim=8,
                                                     impl=impl), x, y, dense=False)
              for impl in ("dense", "folded")}
    assert counts["folded"] == counts["dense"]


def test_cpu_attention_kernel_is_counted():
    """F.scaled_dot_product_attention on CPU (GPSA's content term) runs a kernel that torch's
    FlopCounterMode does not know; the harness counts it as the two products it computes."""
    class Attend(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(()))

        def forward(self, x):                               # x: (B, heads, N, D)
            out = torch.nn.functional.scaled_dot_product_attention(x * self.scale, x, x)
            return out.flatten(1)

    b, heads, n, d = 2, 3, 10, 4
    x = torch.randn(b, heads, n, d, requires_grad=True)
    forward, train = count_training_flops(Attend(), x, torch.tensor([0, 1]))
    assert forward == 2 * 2 * b * heads * n * n * d          # scores and the value average
    # backward: five products of the same size (scores recomputed; gradients of values, probabilities,
    # queries and keys), torch's convention for its CUDA kernels
    assert train == forward + 5 * forward // 2


@pytest.mark.parametrize("impl", ["bilinear", "explicit-onehot"])
def test_flops_per_image_charge_a_steps_shared_products_to_its_whole_batch(impl):
    """The bilinear path folds its query map once per step, whatever the batch: per image at batch 7
    (extrapolated from 2 and 4 images) equals the count on 7 images, and is less than the count on 2
    images halved; a path without shared products (explicit-onehot here) counts the same per image."""
    torch.manual_seed(0)
    model = build_model("learned-content", num_layers=1, dim=24, num_heads=4, mlp_dim=8, impl=impl)
    x, y = torch.randn(7, 3, 16, 16), torch.arange(7)
    per_image = flops_per_image(model, x, y, 7, dense=False)
    direct = count_training_flops(model, x, y, dense=False)
    assert per_image == pytest.approx(tuple(f / 7 for f in direct), rel=1e-12)
    two = count_training_flops(model, x[:2], y[:2], dense=False)
    if impl == "bilinear":
        assert per_image[0] < two[0] / 2 and per_image[1] < two[1] / 2
    else:
        assert per_image == pytest.approx(tuple(f / 2 for f in two), rel=1e-12)
    assert flops_per_image(model, x, y, 3, dense=False) == tuple(f / 3 for f in count_training_flops(
        model, x[:3], y[:3], dense=False))
    with pytest.raises(ValueError, match="counting a step of 7 images needs at least 4 of them, got 3"):
        flops_per_image(model, x[:3], y[:3], 7)


def test_time_median_measures_sleep():
    import time
    t = time_median(lambda: time.sleep(0.02), torch.device("cpu"), warmup=0, reps=3)
    assert 0.015 < t < 0.2


def test_bench_preset_reports_the_presets_model_at_the_batch_asked_for():
    """Its parameters, and the FLOPs per image of a step of all 8 images counted directly (the
    harness extrapolates them from steps of 2 and 4)."""
    r = bench_preset("demo", batch_size=8, reps=1)
    assert r["parameters"] == 78_690 == count_parameters(build_model("demo"))
    forward, train = count_training_flops(build_model("demo"), torch.randn(8, 3, 32, 32), torch.arange(8))
    assert (r["forward_flops_per_image"], r["train_flops_per_image"]) == pytest.approx((forward / 8, train / 8),
                                                                                         rel=1e-12)
    assert r["train_images_per_s"] > 0 and r["infer_images_per_s"] > 0


def test_bench_times_the_paths_a_run_would_take_here(monkeypatch):
    from attncnn.perf import Choice, device_kind
    from attncnn.perf.bench import harness
    calls = []

    def choose(device_type, kind, grid, precision, steps, *, batch):
        calls.append((device_type, kind, grid, precision, batch))
        return Choice("dense", "separable", False, "")

    monkeypatch.setattr(harness, "choose", choose)
    r = bench_preset("demo", batch_size=8, reps=1)
    assert calls == [(device_kind("cpu"), "quadratic", (8, 8), "fp32", 8)]      # demo: 32 x 32 images, pooling 4
    assert r["attention_paths"] == {"train": ["dense"] * 2, "eval": ["separable"] * 2}      # demo: 2 blocks
    # paths the options name are timed as given, the rule not asked
    monkeypatch.setattr(harness, "choose", lambda *a, **k: pytest.fail("must not ask the rule"))
    r = bench_preset("demo", batch_size=8, reps=1, overrides={"impl": "folded", "num_layers": 2})
    assert r["attention_paths"] == {"train": ["folded"] * 2, "eval": ["folded"] * 2}
    assert bench_preset("resnet18-mini", batch_size=4, reps=1)["attention_paths"] == {"train": None, "eval": None}


@pytest.mark.needs_fast_bf16          # times a 2048^3 bf16 product seven times and a bf16 step
def test_bench_command_json(capsys):
    assert main(["bench", "--presets", "demo", "--batch-size", "4", "--reps", "1", "--variants", "fp32,bf16",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["preset"], r["precision"], r["compile"]) for r in out["results"]] == [("demo", "fp32", False),
                                                                                     ("demo", "bf16", False)]
    assert out["matmul_peak_flops_per_s"]["fp32"] > 0 and out["matmul_peak_flops_per_s"]["bf16"] > 0
    assert out["machine"]["torch"] == torch.__version__


def test_bench_command_times_the_path_it_is_given(capsys):
    from attncnn.perf import choose, device_kind

    ruled = choose(device_kind("cpu"), "quadratic", (8, 8), "fp32", 0)                    # demo on 32 x 32 images
    assert bench_preset("demo", batch_size=4, reps=1)["attention_paths"] == {"train": [ruled.train_impl] * 2,
                                                                             "eval": [ruled.eval_impl] * 2}
    other = next(p for p in ("dense", "folded") if p != ruled.train_impl)
    assert main(["bench", "--presets", "demo", "--batch-size", "4", "--reps", "1", "--variants", "fp32",
                 "--device", "cpu", "--set", f"impl={other}", "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["attention_paths"] == {"train": [other] * 2, "eval": [other] * 2}


def test_unknown_variants_are_refused(capsys):
    assert main(["bench", "--presets", "demo", "--variants", "fp16"]) == 2
    assert "unknown benchmark variant(s) ['fp16']; choose from fp32, bf16" in capsys.readouterr().err


def test_an_isolated_benchmark_whose_process_dies_fails_instead_of_hanging():
    # from `python -` a spawned child cannot import the caller's __main__ and dies before answering
    code = ("from attncnn.perf.bench.harness import bench_preset_isolated\n"
            "bench_preset_isolated(preset='demo', reps=1)\n")
    done = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "RuntimeError: benchmark of demo failed: its process exited with code" in done.stderr


@pytest.mark.parametrize("fast", [False, True], ids=["no-bf16-units", "bf16-units"])
def test_bench_times_bf16_by_default_only_where_it_is_fast(fast, capsys, monkeypatch):
    from attncnn.perf import precision as run_precision
    from attncnn.perf.bench import harness

    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: fast)
    peaks, steps = [], []          # what would be timed; the timings themselves are not the point here
    monkeypatch.setattr(harness, "matmul_peak", lambda device, dtype: peaks.append(dtype) or 1e9)
    monkeypatch.setattr(harness, "bench_preset_isolated", lambda **kw: steps.append(kw["precision"]) or kw)
    assert main(["bench", "--presets", "demo", "--reps", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    if fast:
        assert steps == ["fp32", "bf16"] and peaks == [torch.float32, torch.bfloat16] and err == ""
    else:
        assert steps == ["fp32"] and peaks == [torch.float32]
        assert set(json.loads(out)["matmul_peak_flops_per_s"]) == {"fp32"}
        assert err.count("\n") == 1 and "bf16 skipped: CPU " in err and "--variants fp32,bf16" in err
        # asked for, it is timed
        assert main(["bench", "--presets", "demo", "--reps", "1", "--variants", "bf16", "--json"]) == 0
        assert steps[-1] == "bf16" and peaks[-1] == torch.bfloat16
