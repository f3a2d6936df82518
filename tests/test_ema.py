"""`trainer.ema_decay`: validation and export on a moving average of the trained parameters (trainer/ema.py),
checked against hand-computed averages and across a resume."""

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from omnialign.config import apply_overrides, validate
from omnialign.engine import checkpoint
from omnialign.export import load_trained_network
from omnialign.metrics import read_metrics, without_timing
from omnialign.recipes import RECIPES
from omnialign.train import main
from omnialign.trainer.ema import ParameterAverage


def test_the_average_follows_the_warm_up_then_the_decay_and_only_every_few_steps():
    layer = nn.Linear(2, 1, bias=False)
    layer.weight.requires_grad_(False)  # frozen: not averaged
    layer.register_parameter("b", nn.Parameter(torch.tensor([1.0])))
    average = ParameterAverage(layer, decay=0.9, every=2)
    assert list(average.average) == ["b"]
    with torch.no_grad():
        layer.b.fill_(11.0)
    average.update(1)  # not a step of its own
    assert average.average["b"].item() == 1.0
    average.update(2)  # weight 1 - min(2 / 11, 0.9) = 9 / 11: 1 + 9 / 11 * 10
    torch.testing.assert_close(average.average["b"], torch.tensor([1 + 90 / 11]))
    with torch.no_grad():
        layer.b.fill_(0.0)
    before = average.average["b"].clone()
    average.update(100)  # min(100 / 109, 0.9) = 0.9: a tenth of the way to 0
    torch.testing.assert_close(average.average["b"], before * 0.9)
    with average.applied():
        torch.testing.assert_close(layer.b.detach(), before * 0.9)
    assert layer.b.item() == 0.0 and layer.b.requires_grad


def run(tmp_path, name, *extra):
    config = validate(apply_overrides(RECIPES["debug"](), [
        f"trainer.output_dir={tmp_path / name}", "model.lora.rank=4", "model.lora.alpha=8", "actor.lr=1e-2",
        "trainer.ema_decay=0.5", "trainer.save_every=1", "trainer.val_every=1", "trainer.keep_last=0", *extra,
    ]))  # fmt: skip
    return config


def test_a_run_validates_checkpoints_and_exports_the_average_and_resumes_it(tmp_path):
    """debug with LoRA, decay 0.5: after step 2 the average is a1 + (1 - min(2 / 11, 0.5)) (p2 - a1), where a1 is
    step 1's checkpointed average and p2 step 2's trained parameters; a run resumed at step 1 writes the same
    metrics, whose validation saw the average, not the parameters."""
    main(run(tmp_path, "a"))
    steps = checkpoint.checkpoints(tmp_path / "a" / "debug")
    assert len(steps) == 2
    _, net1, _ = load_trained_network(steps[0])
    _, net2, _ = load_trained_network(steps[1])
    a1 = {n: p.detach().clone() for n, p in net1.named_parameters() if p.requires_grad}
    a2 = {n: p.detach().clone() for n, p in net2.named_parameters() if p.requires_grad}
    p2 = {n: torch.empty_like(p) for n, p in a2.items()}
    dcp.load({"model": p2}, checkpoint_id=steps[1], no_dist=True)
    assert a1 and any(not torch.equal(a2[n], p2[n]) for n in a2)
    for n in a2:
        torch.testing.assert_close(a2[n], a1[n] + 9 / 11 * (p2[n] - a1[n]), atol=1e-6, rtol=1e-5)

    main(run(tmp_path, "b", "trainer.total_steps=1"))
    main(run(tmp_path, "b"), resume="auto")
    a, b = (without_timing(read_metrics(tmp_path / x / "debug" / "metrics.jsonl")) for x in "ab")
    assert a == b
    main(run(tmp_path, "c", "trainer.ema_decay=0"))
    plain = without_timing(read_metrics(tmp_path / "c" / "debug" / "metrics.jsonl"))
    assert [r.get("actor/loss") for r in plain] == [r.get("actor/loss") for r in a]  # the same training
    assert plain[-1]["val/reward/mean"] != pytest.approx(a[-1]["val/reward/mean"], abs=1e-7)  # validated elsewhere
