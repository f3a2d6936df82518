"""Model adapters by architecture: `LOADERS[arch](model_config)` returns a `DiffusionPolicy` on the CPU."""

from omnialign.models import glyphs

LOADERS = {"glyphs": glyphs.load}
