"""LoRA adapters (default, old, reference) and exporting checkpoints to peft and diffusers."""

import pytest
import torch
from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
from peft import PeftModel

from omnialign import export as export_module
from omnialign.cli import main as cli
from omnialign.config import apply_overrides, validate
from omnialign.engine import checkpoint
from omnialign.export import export, load_trained_network, write_adapter
from omnialign.models import lora, tiny
from omnialign.recipes import RECIPES
from omnialign.train import main
from omnialign.trainer.objectives import diffusion_nft
from omnialign.worlds.glyphs import model as glyphs


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    policy = glyphs.load()
    cond = policy.encode_prompts(["3", "8"])
    return torch.randn(2, 1, 32, 32, generator=g), torch.tensor([0.7, 0.3]), cond


def perturb(module: torch.nn.Module, name: str = "default") -> None:
    with torch.no_grad():
        for layer in lora.lora_layers(module):
            layer.lora_B[name].weight.normal_(0, 0.05)


def test_lora_trains_only_adapters_and_disabling_gives_the_base():
    x, sigma, cond = inputs()
    policy = glyphs.load()
    base = policy.velocity(x, sigma, cond)
    lora.apply_lora(policy.transformer, rank=4, alpha=8, targets=policy.lora_targets)
    trainable = [n for n, p in policy.transformer.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.dtype == torch.float32 for p in policy.transformer.parameters() if p.requires_grad)
    torch.testing.assert_close(policy.velocity(x, sigma, cond), base)  # B = 0 at init
    perturb(policy.transformer)
    assert not torch.allclose(policy.velocity(x, sigma, cond), base)
    with lora.adapters_disabled(policy.transformer):
        torch.testing.assert_close(policy.velocity(x, sigma, cond), base)
    assert all(p.requires_grad for n, p in policy.transformer.named_parameters() if n in trainable)


def test_old_adapter_copies_and_blends_and_stays_frozen():
    x, sigma, cond = inputs()
    policy = glyphs.load()
    config = lora.apply_lora(policy.transformer, rank=4, alpha=8, targets=policy.lora_targets)
    perturb(policy.transformer)
    lora.add_adapter(policy.transformer, "old", config)
    trained = policy.velocity(x, sigma, cond)
    with lora.use_adapter(policy.transformer, "old"):
        torch.testing.assert_close(policy.velocity(x, sigma, cond), trained)  # a copy
    old_params = [p for n, p in policy.transformer.named_parameters() if ".old." in n]
    assert old_params and not any(p.requires_grad for p in old_params)
    layer = lora.lora_layers(policy.transformer)[0]
    before_old = layer.lora_B["old"].weight.clone()
    perturb(policy.transformer)  # default moves on
    lora.blend_adapter(policy.transformer, "old", decay=0.75)
    expected = 0.75 * before_old + 0.25 * layer.lora_B["default"].weight
    torch.testing.assert_close(layer.lora_B["old"].weight, expected)
    assert not any(p.requires_grad for p in old_params)


def test_nft_refresh_decays_the_old_adapter_by_optimizer_steps():
    """glyphs_nft takes two optimizer steps per training step (64 samples, mini-batches of 32): after training
    step 40, 80 optimizer steps have run and delayed_linear gives d = 0.0075 * (80 - 75), as DiffusionNFT's
    global_step would (counting training steps gave 0)."""
    config = RECIPES["glyphs_nft"]()
    policy = glyphs.load()
    spec = lora.apply_lora(policy.transformer, rank=4, alpha=8, targets=policy.lora_targets)
    lora.add_adapter(policy.transformer, "old", spec)
    perturb(policy.transformer, "default")
    layer = lora.lora_layers(policy.transformer)[0]
    old, default = layer.lora_B["old"].weight.clone(), layer.lora_B["default"].weight.clone()
    diffusion_nft(policy, config, None, None, None).after_update(40, {})
    d = 0.0075 * 5
    torch.testing.assert_close(layer.lora_B["old"].weight, d * old + (1 - d) * default)


def test_lora_targets_that_match_nothing_fail_clearly():
    policy = glyphs.load()
    with pytest.raises(ValueError, match="matched no module"):
        lora.apply_lora(policy.transformer, rank=4, alpha=4, targets=["no_such_proj"])


def trained_run(tmp_path, *overrides):
    config = validate(apply_overrides(RECIPES["debug"](), [f"trainer.output_dir={tmp_path}", "actor.lr=1e-2",
                                                          *overrides]))  # fmt: skip
    main(config)
    return checkpoint.latest(tmp_path / "debug")


def trained_velocity(ckpt, x, sigma, cond):
    _, net, _ = load_trained_network(ckpt)
    policy = glyphs.load()
    policy.transformer = net
    return policy.velocity(x, sigma, cond)


def test_exported_adapter_loads_in_peft_and_diffusers(tmp_path):
    ckpt = trained_run(tmp_path, "model.lora.rank=4", "model.lora.alpha=8")
    out = export(ckpt, tmp_path / "adapter")
    assert {"adapter_config.json", "adapter_model.safetensors", "pytorch_lora_weights.safetensors"} <= {
        p.name for p in out.iterdir()
    }
    x, sigma, cond = inputs()
    expected = trained_velocity(ckpt, x, sigma, cond)
    base = glyphs.load().velocity(x, sigma, cond)
    assert not torch.allclose(expected, base)  # training moved the adapter

    policy = glyphs.load()
    policy.transformer = PeftModel.from_pretrained(policy.transformer, out)
    torch.testing.assert_close(policy.velocity(x, sigma, cond), expected)

    policy = glyphs.load()
    policy.transformer.load_lora_adapter(out, weight_name="pytorch_lora_weights.safetensors", prefix="transformer")
    torch.testing.assert_close(policy.velocity(x, sigma, cond), expected)


def test_an_interrupted_export_leaves_no_adapter_folder(tmp_path, monkeypatch):
    ckpt = trained_run(tmp_path, "model.lora.rank=4", "model.lora.alpha=8")
    real_save = export_module.save_file

    def crash_on_the_second_file(tensors, path, **kwargs):
        if str(path).endswith("pytorch_lora_weights.safetensors"):
            raise OSError("disk full")
        real_save(tensors, path, **kwargs)

    monkeypatch.setattr(export_module, "save_file", crash_on_the_second_file)
    with pytest.raises(OSError, match="disk full"):
        export(ckpt, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()
    monkeypatch.undo()
    assert (export(ckpt, tmp_path / "adapter") / "pytorch_lora_weights.safetensors").exists()


def test_exported_full_model_loads_with_from_pretrained(tmp_path, capsys):
    ckpt = trained_run(tmp_path)
    out = export(ckpt, tmp_path / "full")
    x, sigma, cond = inputs()
    policy = glyphs.load()
    policy.transformer = SD3Transformer2DModel.from_pretrained(out)
    torch.testing.assert_close(policy.velocity(x, sigma, cond), trained_velocity(ckpt, x, sigma, cond))
    cli(["export", str(ckpt.parent.parent), "--to", str(tmp_path / "from_run")])  # the run folder: its newest
    assert "exported the full network" in capsys.readouterr().out
    assert (tmp_path / "from_run" / "config.json").read_text() == (out / "config.json").read_text()
    policy.transformer = SD3Transformer2DModel.from_pretrained(tmp_path / "from_run")
    torch.testing.assert_close(policy.velocity(x, sigma, cond), trained_velocity(ckpt, x, sigma, cond))


def test_export_of_a_missing_or_empty_folder_names_it(tmp_path):
    with pytest.raises(SystemExit, match=r"export: .*nowhere does not exist: give a run folder"):
        cli(["export", str(tmp_path / "nowhere"), "--to", str(tmp_path / "out")])
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"export: .*run: a run folder without a complete checkpoint"):
        cli(["export", str(tmp_path / "run"), "--to", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_exported_adapter_layout_loads_into_a_diffusers_pipeline(tmp_path):
    """The diffusers file of an export is what SD3's `load_lora_weights` reads, alpha included."""
    path = tiny.sd3(tmp_path / "sd3", seed=0)
    pipe = StableDiffusion3Pipeline.from_pretrained(path)
    config = lora.apply_lora(pipe.transformer, rank=2, alpha=8, targets=["to_q", "to_v"])
    perturb(pipe.transformer)
    out = write_adapter(pipe.transformer, config, tmp_path / "adapter")
    g = torch.Generator().manual_seed(0)
    kwargs = dict(hidden_states=torch.randn(1, 4, 8, 8, generator=g), timestep=torch.tensor([500.0]),
                  encoder_hidden_states=torch.randn(1, 8, 96, generator=g),
                  pooled_projections=torch.randn(1, 80, generator=g))  # fmt: skip
    expected = pipe.transformer(**kwargs).sample
    fresh = StableDiffusion3Pipeline.from_pretrained(path)
    assert not torch.allclose(fresh.transformer(**kwargs).sample, expected)
    fresh.load_lora_weights(out)
    torch.testing.assert_close(fresh.transformer(**kwargs).sample, expected)
