"""engine.fp8: frozen linear layers in float8 (engine/fp8.py), checked against the products of the rounded operands
computed by hand, and a tiny Qwen-Image LoRA run trained with them."""

import pytest
import torch
from torch import nn

from omnialign.config import ConfigError, apply_overrides, validate
from omnialign.engine.fp8 import Float8Linear, float8_frozen_linears, to_float8
from omnialign.recipes import RECIPES


def test_each_row_is_scaled_so_that_its_largest_magnitude_is_448():
    x8, scale = to_float8(torch.tensor([[0.5, -1.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.1, 0.0, 0.0]]))
    torch.testing.assert_close(scale, torch.tensor([[2 / 448], [1.0], [3 / 448]]))
    assert x8.dtype == torch.float8_e4m3fn
    assert x8[0].float().tolist() == [112.0, -224.0, 448.0, 0.0]  # exact: 0.5 * 224, 1 * 224, 2 * 224
    assert x8[1].float().tolist() == [0.0] * 4
    # 0.1 * 448 / 3 = 14.93 rounds to 15 (e4m3 has 3 mantissa bits: 14, 15, 16 are its neighbours there)
    assert x8[2].float().tolist() == [448.0, 15.0, 0.0, 0.0]


def dequantized(x: torch.Tensor) -> torch.Tensor:
    """x as its float8 rounding represents it, in float64: the rounded rows times their scales."""
    x8, scale = to_float8(x)
    return x8.double() * scale.double()


def test_a_float8_layer_computes_the_product_of_the_rounded_input_and_weight_and_its_input_gradient():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the GPU tier's phase 1 runs it on CUDA
    torch.manual_seed(0)
    linear = nn.Linear(64, 48).requires_grad_(False).to(device)
    layer = Float8Linear(linear)
    x = torch.randn(2, 5, 64, device=device, requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 5, 48) and y.dtype == torch.float32
    by_hand = dequantized(x.detach().reshape(10, 64)) @ dequantized(linear.weight).T + linear.bias.double()
    # the product is rounded once to bf16 (8 significant bits) before the bias is added
    torch.testing.assert_close(y.detach().reshape(10, 48).double(), by_hand, rtol=2**-8, atol=2**-8)
    exact = linear(x.detach())
    error = (y.detach() - exact).norm() / exact.norm()
    assert 0 < error < 0.05  # float8 rounding of both operands: a few percent, not nothing
    grad = torch.randn(2, 5, 48, device=device)
    y.backward(grad)
    # straight through the input's rounding; the gradient arrives in the product's bf16 (8 significant bits)
    expected = grad.reshape(10, 48).double() @ dequantized(linear.weight)
    assert (x.grad.reshape(10, 64).double() - expected).norm() / expected.norm() < 2**-8
    assert not any(p.requires_grad for p in layer.parameters())


def test_the_float8_backward_multiplies_the_rounded_gradient_rows_by_the_float8_weight():
    """engine.fp8_backward: the forward is the same, bit for bit; the input's gradient is the product of the output's
    gradient (times the weight's per-channel scale) rounded per row to float8 and the float8 weight itself."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the GPU tier's phase 1 runs it on CUDA
    torch.manual_seed(0)
    linear = nn.Linear(64, 48).requires_grad_(False).to(device)
    x = torch.randn(10, 64, device=device)
    grad = torch.randn(10, 48, device=device)
    outputs, grads = [], []
    for float8_grad in (False, True):
        layer, xi = Float8Linear(linear, float8_grad), x.clone().requires_grad_(True)
        outputs.append(layer(xi))
        outputs[-1].backward(grad)
        grads.append(xi.grad.double())
    assert torch.equal(outputs[0], outputs[1])
    weight8, weight_scale = to_float8(linear.weight)
    # the gradient arrives at the product in its bf16 output's precision; their product is rounded once to bf16
    by_hand = dequantized(grad.bfloat16().float() * weight_scale.T) @ weight8.double()
    assert (grads[1] - by_hand).norm() / by_hand.norm() < 2**-8
    exact = grad.double() @ dequantized(linear.weight)
    error = (grads[1] - exact).norm() / exact.norm()
    assert 2**-8 < error < 0.05  # the gradient's float8 rounding: a few percent, more than bf16's
    assert (grads[0] - exact).norm() / exact.norm() < 2**-8


def test_fp8_backward_needs_fp8():
    with pytest.raises(ConfigError, match="engine.fp8_backward=true .* set engine.fp8=true"):
        validate(apply_overrides(RECIPES["qwen_image_ocr_flowgrpo_lora"](), ["engine.fp8_backward=true"]))
    overrides = ["engine.fp8=true", "engine.fp8_backward=true"]
    config = validate(apply_overrides(RECIPES["qwen_image_ocr_flowgrpo_lora"](), overrides))
    assert config.engine.fp8_backward


def test_only_frozen_layers_whose_sizes_are_multiples_of_16_are_replaced():
    block = nn.Sequential(nn.Linear(32, 16), nn.Linear(16, 32), nn.Sequential(nn.Linear(32, 24), nn.Linear(24, 40)))
    block.requires_grad_(False)
    block[1].requires_grad_(True)  # a trained layer keeps its weights
    assert float8_frozen_linears([block]) == 1 + 0 + 0
    assert [type(m).__name__ for m in (block[0], block[1], block[2][0], block[2][1])] == [
        "Float8Linear", "Linear", "Linear", "Linear"
    ]  # fmt: skip
    assert not any("weight8" in k for k in block.state_dict())  # the float8 copies stay out of every checkpoint


def test_frozen_lora_adapters_stay_as_they_are():
    """A second adapter (`old`, `reference`) is frozen too, but it is a LoRA table, not a base layer."""
    from omnialign.models import lora

    block = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 16))
    config = lora.apply_lora(block, 16, 16, ["0"])
    lora.add_adapter(block, "old", config)
    assert float8_frozen_linears([block]) == 2
    assert type(block[0].base_layer) is Float8Linear and type(block[1]) is Float8Linear
    assert type(block[0].lora_A["old"]) is nn.Linear and type(block[0].lora_B["old"]) is nn.Linear
    with lora.use_adapter(block, "old"):
        assert block(torch.randn(3, 32)).shape == (3, 16)


def test_fp8_needs_a_lora_run():
    with pytest.raises(ConfigError, match="engine.fp8=true.*model.lora.rank=0"):
        validate(apply_overrides(RECIPES["qwen_image_ocr_flowgrpo_full"](), ["engine.fp8=true"]))


def tiny_qwen_image_config(tmp_path, *overrides: str):
    """Two steps of FlowGRPO LoRA on the tiny Qwen-Image in bf16, scored by JPEG size."""
    from omnialign.data.ocr import prepare_ocr
    from omnialign.models import tiny

    (tmp_path / "ocr").mkdir()
    (tmp_path / "ocr" / "train.txt").write_text('A sign that says "OPEN"\nA mug printed with "42"\n')
    (tmp_path / "ocr" / "test.txt").write_text('A poster reading "HELLO"\n')
    prepare_ocr(tmp_path / "ocr", tmp_path / "data")
    model = tiny.qwen_image(tmp_path / "model")
    small = [f"model.path={model}", "model.dtype=bfloat16", f"data.prompts={tmp_path / 'data' / 'train.parquet'}",
             f"data.val_prompts={tmp_path / 'data' / 'test.parquet'}", "data.prompts_per_step=2", "rollout.n=2",
             "rollout.height=32", "rollout.width=32", "rollout.steps=4", "rollout.val_steps=4",
             "rollout.micro_batch_size=4", "actor.micro_batch_size=4", "actor.mini_batch_size=none",
             "model.lora.rank=4", "model.lora.alpha=8", "engine.activation_checkpointing=false", "engine.compile=false",
             "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false",
             "rollout.window_end=3", 'reward.weights={"jpeg_compressibility": 1}', *overrides]  # fmt: skip
    return validate(apply_overrides(RECIPES["qwen_image_ocr_flowgrpo_lora"](), small))


def train_and_check_replay(config, out) -> list[str]:
    """Train `config` into `out`; check each update's first ratio is exactly 1 and its KL estimate 0 (the replayed
    log-probs are the rollout's) and that the adapters got a gradient; the names of the checkpoint's tensors."""
    from torch.distributed.checkpoint import FileSystemReader

    from omnialign.metrics import read_metrics
    from omnialign.train import main

    main(apply_overrides(config, [f"trainer.output_dir={out}"]))
    records = read_metrics(out / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in records[1:]:
        assert r["actor/ratio"] == 1.0 and r["actor/approx_kl"] == 0.0 and r["actor/grad_norm"] > 0
    return sorted(
        FileSystemReader(out / config.name / "checkpoints" / "step_000002").read_metadata().state_dict_metadata
    )


def test_a_lora_run_with_fp8_trains_its_adapters_and_replays_its_rollout_exactly(tmp_path):
    """The frozen block linears in float8, under LoRA adapters too: the rollout replays exactly, the adapters train,
    and the checkpoint holds the same tensors as a run without fp8."""
    from omnialign.engine import dist
    from omnialign.trainer.build import build_policy

    config = tiny_qwen_image_config(tmp_path)
    policy, _ = build_policy(apply_overrides(config, ["engine.fp8=true"]), dist.init())
    converted = [name for name, m in policy.transformer.named_modules() if isinstance(m, Float8Linear)]
    assert len(converted) >= 20 and any(name.endswith("to_q.base_layer") for name in converted)
    with_fp8 = train_and_check_replay(apply_overrides(config, ["engine.fp8=true"]), tmp_path / "fp8")
    without = train_and_check_replay(config, tmp_path / "bf16")
    assert with_fp8 == without and any("lora_A" in k for k in with_fp8)


# inductor's C++ (CPU) code keeps eager's bf16 roundings under emulate_precision_casts only from torch 2.13 (pytorch
# PRs 182882 and 185847); torch 2.11's drops them (the block below: 2,359 of 4,096 outputs differed between rollout
# and update, by up to 0.031; the compiled tiny Qwen-Image run's first update: approx KL -9.1e-5 in bf16, 2.4e-4 in
# fp8). Its CUDA code keeps them: the GPU tier's compiled fp8 step replays exactly on 2.11.
OLD_CPU_INDUCTOR = torch.torch_version.TorchVersion(torch.__version__) < (2, 13)
CPU_DROPS_CASTS = "torch < 2.13 ignores emulate_precision_casts in inductor's CPU code"


class FusedBlock(nn.Module):
    """A modulated norm feeding two frozen linear layers through a GELU, the shape of a DiT block's MLP: inductor can
    fuse the norm and the modulation into the first layer's input and the GELU into the second's."""

    def __init__(self, width: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.modulation = nn.Linear(width, width)  # trained
        self.up = nn.Linear(width, hidden).requires_grad_(False)
        self.down = nn.Linear(hidden, width).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x) * (1 + self.modulation(x))
        return x + self.down(nn.functional.gelu(self.up(h), approximate="tanh"))


def compiled_rollout_and_update(block: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The block compiled as engine.compile does (`compile_forward`), run on x as the rollout does (no grad) and as
    the update does (with its backward)."""
    from omnialign.engine.fsdp import compile_forward

    compile_forward(block)
    with torch.no_grad():
        rollout = block(x)
    update = block(x)
    update.float().sum().backward()
    return rollout, update


@pytest.mark.skipif(OLD_CPU_INDUCTOR, reason=CPU_DROPS_CASTS)  # the block runs on the CPU
def test_a_compiled_float8_block_gives_the_same_bits_in_the_rollout_and_the_update():
    """engine.compile (`compile_forward`): the rollout's no-grad graph and the update's graph fuse differently; with
    eager's bf16 roundings kept they give the same outputs, so the replay is exact (without them, on the CPU, 1,825
    of 4,096 outputs differed, by up to 0.023)."""
    torch.manual_seed(0)
    block = FusedBlock().to(torch.bfloat16)
    assert float8_frozen_linears([block]) == 2  # after the cast: Module.to(dtype) would cast the float8 buffers too
    rollout, update = compiled_rollout_and_update(block, torch.randn(4, 16, 64, dtype=torch.bfloat16))
    assert block.modulation.weight.grad.abs().sum() > 0
    assert torch.equal(rollout, update)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_a_compiled_block_at_full_width_gives_the_same_bits_in_the_rollout_and_the_update(fp8):
    """The block above at FLUX.1's width (3072, MLP 12288) and a 1024 + 512-token sequence, on CUDA: at full size the
    compiled fp8 replay clipped 3-9% of FLUX's and Kontext's samples at an exact-replay setting (bf16: none;
    BENCHMARKS.md, issue 32), where the tiny CUDA step replays exactly. On an H100 (torch 2.11) both cases failed
    (bf16: 2,005 of 9,437,184 outputs apart), inductor timing each reduction kernel's block sizes on its own; both
    passed with its reduction-config filter, which compile_forward now sets (docs/engine.md)."""
    torch.manual_seed(0)
    block = FusedBlock(3072, 12288).to("cuda", torch.bfloat16)
    if fp8:
        assert float8_frozen_linears([block]) == 2  # after the cast (see above)
    rollout, update = compiled_rollout_and_update(
        block, torch.randn(2, 1536, 3072, device="cuda", dtype=torch.bfloat16)
    )
    differ = (rollout != update).sum().item()
    assert differ == 0, f"{differ} of {rollout.numel()} outputs differ, by up to {(rollout - update).abs().max()}"


@pytest.mark.gpu
@pytest.mark.parametrize("backward", ["false", "true"], ids=["bf16_backward", "fp8_backward"])
def test_fp8_compiled_step_replays_its_rollout_exactly(tmp_path, backward):
    """On CUDA with the blocks compiled (engine.compile), as the full-size recipes run: torch._scaled_mm inside
    inductor's graphs in rollout and update alike, and in the backward with engine.fp8_backward."""
    config = tiny_qwen_image_config(
        tmp_path, "engine.fp8=true", "engine.compile=true", f"engine.fp8_backward={backward}"
    )
    assert any("lora_A" in k for k in train_and_check_replay(config, tmp_path / "run"))


@pytest.mark.slow
@pytest.mark.skipif(OLD_CPU_INDUCTOR and not torch.cuda.is_available(), reason=CPU_DROPS_CASTS)
@pytest.mark.parametrize("fp8, grad_graph", [("false", "false"), ("true", "false"), ("true", "true")])
def test_a_compiled_lora_run_replays_its_rollout_exactly_on_this_machine(tmp_path, fp8, grad_graph):
    """engine.compile on whatever device runs the suite (the CPU in CI's slow tier): without eager's bf16 roundings
    inductor's CPU graphs drifted in bf16 too (the bf16 run's two updates: ratios 1.000016 and 0.99961; fp8's first:
    0.99983). With rollout.grad_graph the rollout runs the update's compiled graph instead of its no-grad one."""
    config = tiny_qwen_image_config(
        tmp_path, f"engine.fp8={fp8}", "engine.compile=true", f"rollout.grad_graph={grad_graph}"
    )
    assert any("lora_A" in k for k in train_and_check_replay(config, tmp_path / "run"))
