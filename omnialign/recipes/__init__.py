"""Recipes: functions returning a full `Config`. A variant calls its base and edits a few fields."""

from omnialign.recipes import choice, glyphs, qwen3_omni, qwen_image, sd3

RECIPES = {
    "glyphs": glyphs.glyphs,
    "glyphs_flowgrpo": glyphs.glyphs_flowgrpo,
    "glyphs_cps": glyphs.glyphs_cps,
    "glyphs_dance": glyphs.glyphs_dance,
    "glyphs_mixgrpo": glyphs.glyphs_mixgrpo,
    "glyphs_grpo_guard": glyphs.glyphs_grpo_guard,
    "glyphs_dppo": glyphs.glyphs_dppo,
    "glyphs_nft": glyphs.glyphs_nft,
    "glyphs_online_dpo": glyphs.glyphs_online_dpo,
    "glyphs_distill": glyphs.glyphs_distill,
    "debug": glyphs.debug,
    "qwen_image_ocr_flowgrpo_lora": qwen_image.qwen_image_ocr_flowgrpo_lora,
    "qwen_image_ocr_flowgrpo_full": qwen_image.qwen_image_ocr_flowgrpo_full,
    "qwen_image_ocr_dppo_lora": qwen_image.qwen_image_ocr_dppo_lora,
    "qwen_image_ocr_nft_lora": qwen_image.qwen_image_ocr_nft_lora,
    "qwen_image_ocr_online_dpo_lora": qwen_image.qwen_image_ocr_online_dpo_lora,
    "sd3_offline_dpo": sd3.sd3_offline_dpo,
    "choice_dapo": choice.choice_dapo,
    "choice_grpo": choice.choice_grpo,
    "choice_gspo": choice.choice_gspo,
    "choice_distill": choice.choice_distill,
    "choice_gspo_noised": choice.choice_gspo_noised,
    "choice_dpo": choice.choice_dpo,
    "qwen3_omni_grpo": qwen3_omni.qwen3_omni_grpo,
    "qwen3_omni_dapo": qwen3_omni.qwen3_omni_dapo,
    "qwen3_omni_gspo": qwen3_omni.qwen3_omni_gspo,
    "qwen3_omni_dpo": qwen3_omni.qwen3_omni_dpo,
}

DEFAULT = "glyphs"
