"""benchmarks/profile_step.py: its FLOPs are the harness's count, it recognises the product kernels (CPU
operators and GPU kernels by name), and it profiles a compiled step."""


import pytest
import torch

from profile_step import profile_preset

from attncnn import build_model
from attncnn.perf.bench.harness import count_training_flops


#: the trainer tests' model and batch (tests/training/test_trainer.py): the compiled step's training graph is
#: then the one those tests compile, in inductor's cache for all of them (a compilation here costs tens of seconds)
SMALL = {"dim": 16, "mlp_dim": 16}
BATCH, CLASSES = 10, 3


@pytest.fixture(scope="module")
def eager_profile() -> dict:
    """The eager profile of a small preset, made once: the tests below only read it."""
    return profile_preset("demo", batch_size=BATCH, precision="fp32", steps=1, num_classes=CLASSES,
                          model_options=SMALL)


def test_profile_of_a_small_preset_is_complete_and_counts_the_run_flops(eager_profile):
    result = eager_profile
    torch.manual_seed(0)
    model = build_model("demo", CLASSES, **SMALL)
    forward, train = count_training_flops(model, torch.randn(BATCH, 3, 32, 32), torch.arange(BATCH) % CLASSES,
                                          dense=False)
    assert result["train"]["flops_per_image"] == train / BATCH
    assert result["test"]["flops_per_image"] == forward / BATCH
    for mode in ("train", "test"):
        shares = result[mode]["shares"]
        # the product kernels' names are recognised (shares of tiny steps vary too much to bound more)
        assert shares.get("products", 0.0) > 0
        assert result[mode]["wall_seconds"] > 0


def test_gpu_kernels_are_grouped_by_their_names():
    from profile_step import kernel_group

    names = {
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "products",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopB_TNN": "products",
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>": "products",
        "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>": "products",
        "triton_tem_fused_mm_0": "products",
        "void (anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float>": "softmax",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>": "normalisation",
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16>": "dropout",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<3>>": "optimiser",
        "triton_poi_fused__softmax_add_0": "softmax",           # a fused kernel named after its softmax
        "triton_red_fused_native_layer_norm_backward_3": "normalisation",
        "triton_per_fused_add_mul_sum_7": "fused (compiled)",
        "Memcpy DtoD (Device -> Device)": "copies and casts",
        "void at::native::elementwise_kernel<128, 2, direct_copy_kernel_cuda>": "copies and casts",
        "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>": "activations",
        "void at::native::reduce_kernel<512, 1, ReduceOp<float, func_wrapper_t<float, sum_functor>>>": "other",
    }
    assert {name: kernel_group(name) for name in names} == names


@pytest.mark.slow
def test_a_compiled_step_is_profiled_with_the_eager_models_flops(eager_profile):
    eager = eager_profile
    compiled = profile_preset("demo", batch_size=BATCH, precision="fp32", steps=1, compile=True, num_classes=CLASSES,
                              model_options=SMALL)
    assert compiled["compiled"] and not eager["compiled"]
    for mode in ("train", "test"):
        assert compiled[mode]["flops_per_image"] == eager[mode]["flops_per_image"]
        assert compiled[mode]["wall_seconds"] > 0 and sum(compiled[mode]["shares"].values()) > 0.99
        # the generated code's own time is a group of its own, as on a GPU
        assert compiled[mode]["shares"].get("fused (compiled)", 0) > 0
        assert "fused (compiled)" not in eager[mode]["shares"]
