"""Networks built from :mod:`attncnn.layers`: the paper's image transformer, the ResNet18 baseline, presets."""

from .image_transformer import ImageTransformer, ImageTransformerConfig, TransformerBlock
from .presets import (ARCHITECTURES, PRESETS, Preset, build_model, build_model_from_config,
                      count_parameters, get_preset, list_presets, preset_model_config)
from .resnet import BasicBlock, ResNet, ResNetConfig

__all__ = ["ImageTransformer", "ImageTransformerConfig", "TransformerBlock", "ResNet", "ResNetConfig",
           "BasicBlock", "Preset", "PRESETS", "ARCHITECTURES", "build_model", "build_model_from_config",
           "preset_model_config", "count_parameters", "get_preset", "list_presets"]
