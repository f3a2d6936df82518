"""Offline Diffusion-DPO end to end: prepare pairs with the tiny SD3 pipeline, train 2 steps without VAE or encoders."""

import json

import pytest

from omnialign.config import Config, ModelConfig, RewardConfig, RolloutConfig, apply_overrides, validate
from omnialign.metrics import read_metrics, without_timing
from omnialign.models import tiny
from omnialign.prepare.offline_dpo import prepare_offline_dpo
from omnialign.recipes import RECIPES
from omnialign.train import main
from omnialign.trainer import build


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("offline_dpo")
    model = tiny.sd3(root / "sd3")
    config = Config(model=ModelConfig(arch="sd3", path=str(model)),
                    reward=RewardConfig(weights={"jpeg_compressibility": 1.0}),
                    rollout=RolloutConfig(n=3, steps=2, height=16, width=24, guidance=2.0))  # fmt: skip
    for split, words in (("train", ["a red cube", "a green ball", "a cat", "a tree"]), ("val", ["a boat", "a car"])):
        (root / f"{split}.jsonl").write_text("".join(json.dumps({"prompt": w}) + "\n" for w in words))
        prepare_offline_dpo(root / f"{split}.jsonl", root / split, config, chunk_size=2, progress=False)
    return model, root


def test_offline_dpo_trains_from_stored_pairs_without_vae_or_encoders(pairs, tmp_path, monkeypatch):
    model, root = pairs
    policies = []
    real_build = build.build_policy

    def record(config, world, policy=None):
        out = real_build(config, world, policy)
        policies.append(out[0])
        return out

    monkeypatch.setattr(build, "build_policy", record)
    config = validate(apply_overrides(RECIPES["sd3_offline_dpo"](), [
        f"model.path={model}", "model.dtype=float32", f"data.pairs={root / 'train'}", f"data.val_pairs={root / 'val'}",
        "data.prompts_per_step=2", "actor.micro_batch_size=2", "model.lora.rank=4", "model.lora.alpha=8",
        "engine.activation_checkpointing=false", "trainer.total_steps=2", "trainer.val_every=1",
        "trainer.save_every=2", "trainer.progress=false", f"trainer.output_dir={tmp_path}",
    ]))  # fmt: skip
    summary = main(config)
    (policy,) = policies
    assert policy.vae is None and policy.text_encoders is None  # nothing but the transformer was loaded
    records = read_metrics(tmp_path / "sd3_offline_dpo" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert 0 <= records[0]["val/dpo/accuracy"] <= 1 and "actor/dpo/accuracy" in records[1]
    assert records[2]["actor/skipped_updates"] == 0 and summary["metric"] == "val/dpo/accuracy"


def test_offline_dpo_without_pairs_fails_clearly(tmp_path):
    config = validate(
        apply_overrides(RECIPES["sd3_offline_dpo"](), ["data.pairs=none", f"trainer.output_dir={tmp_path}"])
    )
    with pytest.raises(ValueError, match="data.pairs"):
        main(config)


def test_offline_dpo_resumes_identically(pairs, tmp_path):
    model, root = pairs

    def config(out, steps):
        return validate(apply_overrides(RECIPES["sd3_offline_dpo"](), [
            f"model.path={model}", "model.dtype=float32", f"data.pairs={root / 'train'}",
            f"data.val_pairs={root / 'val'}", "data.prompts_per_step=2", "actor.micro_batch_size=2",
            "model.lora.rank=4", "model.lora.alpha=8", "engine.activation_checkpointing=false",
            f"trainer.total_steps={steps}", "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false",
            f"trainer.output_dir={out}",
        ]))  # fmt: skip

    main(config(tmp_path / "a", 3))
    main(config(tmp_path / "b", 2))
    main(config(tmp_path / "b", 3), resume="auto")
    a, b = (without_timing(read_metrics(tmp_path / run / "sd3_offline_dpo" / "metrics.jsonl")) for run in "ab")
    assert [r["step"] for r in b] == [0, 1, 2, 3] and a == b
