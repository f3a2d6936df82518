"""Model adapters by architecture: `LOADERS[arch](model_config)` returns a `DiffusionPolicy` (glyphs, qwen_image,
sd3) or a `LanguagePolicy` (qwen3, qwen3_omni) on the CPU."""

from omnialign.models import glyphs, qwen3, qwen3_omni, qwen_image, sd3

LOADERS = {"glyphs": glyphs.load, "qwen_image": qwen_image.load, "sd3": sd3.load, "qwen3": qwen3.load,
           "qwen3_omni": qwen3_omni.load}  # fmt: skip
