"""Model adapters by architecture: `LOADERS[arch](model_config)` returns a `DiffusionPolicy` on the CPU."""

from omnialign.models import glyphs, qwen_image, sd3

LOADERS = {"glyphs": glyphs.load, "qwen_image": qwen_image.load, "sd3": sd3.load}
