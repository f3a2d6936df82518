"""Recipes: functions returning a full `Config`. A variant calls its base and edits a few fields."""

from omnialign.recipes import glyphs

RECIPES = {
    "glyphs": glyphs.glyphs,
    "glyphs_flowgrpo": glyphs.glyphs_flowgrpo,
    "debug": glyphs.debug,
}

DEFAULT = "glyphs"
