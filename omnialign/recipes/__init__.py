"""Recipes: functions returning a full `Config`. A variant calls its base and edits a few fields."""

from omnialign.recipes import flux, flux2, ltx2, qwen3_omni, qwen_image, sd3, wan, zimage
from omnialign.worlds import choice, glyphs

RECIPES = {
    **glyphs.RECIPES,
    "qwen_image_ocr_flowgrpo_lora": qwen_image.qwen_image_ocr_flowgrpo_lora,
    "qwen_image_ocr_flowgrpo_full": qwen_image.qwen_image_ocr_flowgrpo_full,
    "qwen_image_ocr_dppo_lora": qwen_image.qwen_image_ocr_dppo_lora,
    "qwen_image_ocr_nft_lora": qwen_image.qwen_image_ocr_nft_lora,
    "qwen_image_ocr_online_dpo_lora": qwen_image.qwen_image_ocr_online_dpo_lora,
    "qwen_image_ocr_tempflow_lora": qwen_image.qwen_image_ocr_tempflow_lora,
    **qwen_image.EDIT_RECIPES,
    **sd3.RECIPES,
    **flux.RECIPES,
    **flux2.RECIPES,
    **wan.RECIPES,
    **zimage.RECIPES,
    **ltx2.RECIPES,
    **choice.RECIPES,
    "qwen3_omni_grpo": qwen3_omni.qwen3_omni_grpo,
    "qwen3_omni_dapo": qwen3_omni.qwen3_omni_dapo,
    "qwen3_omni_gspo": qwen3_omni.qwen3_omni_gspo,
    "qwen3_omni_dpo": qwen3_omni.qwen3_omni_dpo,
}

DEFAULT = "glyphs"
