"""Model adapters by architecture. Each loader returns a `DiffusionPolicy` on the CPU."""

from omnialign.models import glyphs

LOADERS = {"glyphs": glyphs.load}
