"""Which recipe runs a CPU run of the suite (CI) makes: for each model or task its representatives, FlowGRPO (LoRA
and full), DiffusionNFT and online DPO, which between them take every rollout kind (SDE with log-probs, ODE, pairs);
the other recipes are marked `matrix`, run on a GPU (the tier's phase 1) and with --runslow. Each of their algorithms
is run on its own in tests/test_recipes.py."""

import pytest

REPRESENTATIVES = ("_flowgrpo_lora", "_flowgrpo_full", "_nft_lora", "_online_dpo_lora")


def recipe_params(names: list[str], representatives: tuple[str, ...] = REPRESENTATIVES) -> list:
    """`names` as parameters, those that do not end in one of `representatives` marked `matrix`."""
    return [name if name.endswith(representatives) else pytest.param(name, marks=pytest.mark.matrix) for name in names]
