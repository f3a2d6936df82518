"""Regional compile (`engine.compile`): a block keeps compiled graphs for more batch shapes than dynamo's default, and
`rollout.grad_graph` makes the rollout run the update's graph."""

from types import SimpleNamespace

import torch
from torch._dynamo.utils import counters

from omnialign.config import RolloutConfig
from omnialign.engine.fsdp import compile_forward
from omnialign.rollout.diffusion import rollout_velocity


def test_compiled_block_keeps_a_graph_for_each_of_nine_batch_sizes():
    # BranchGRPO's rollout and training call a block with many batch sizes; past dynamo's default limit of 8 the
    # block would run eagerly and the ninth size would add no graph
    torch._dynamo.reset()
    counters.clear()
    block = torch.nn.Linear(4, 4)
    compile_forward(block)
    for batch in range(1, 10):
        block(torch.randn(batch, 4))
    assert counters["stats"]["unique_graphs"] == 9


def test_a_rollout_with_grad_graph_runs_the_update_graph_of_a_compiled_block():
    """rollout.grad_graph: the rollout's no-grad call runs under grad and detaches, so a compiled block runs one graph
    for rollout and update (two without it: the no-grad graph fuses and reduces on its own, docs/engine.md)."""
    block = torch.nn.Linear(4, 4)
    compile_forward(block)
    policy = SimpleNamespace(velocity=lambda latents, sigma, cond: block(latents))
    for grad_graph, graphs in ((False, 2), (True, 1)):
        torch._dynamo.reset()
        counters.clear()
        velocity = rollout_velocity(policy, RolloutConfig(grad_graph=grad_graph))
        x = torch.randn(2, 4)
        with torch.no_grad():
            rollout = velocity(x, None, None)
        update = velocity(x, None, None)
        update.sum().backward()
        assert not rollout.requires_grad and update.requires_grad and block.weight.grad.abs().sum() > 0
        assert counters["stats"]["unique_graphs"] == graphs


def test_a_lora_run_with_grad_graph_trains_as_without_it(tmp_path):
    """Eager (the CPU suite does not compile): the rollout under grad records the same log-probs, the replay gives
    them back exactly, and every metric but the timings matches a run without it."""
    from test_fp8 import tiny_qwen_image_config, train_and_check_replay

    from omnialign.config import apply_overrides
    from omnialign.metrics import read_metrics

    base, runs = tiny_qwen_image_config(tmp_path), {}
    for grad_graph in ("false", "true"):
        config = apply_overrides(base, [f"rollout.grad_graph={grad_graph}"])
        train_and_check_replay(config, tmp_path / grad_graph)
        records = read_metrics(tmp_path / grad_graph / config.name / "metrics.jsonl")
        runs[grad_graph] = [{k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))} for r in records]
    assert runs["true"] == runs["false"]


def test_only_an_algorithm_that_replays_samples_in_the_update_graph(tmp_path, monkeypatch):
    """rollout.grad_graph serves the replay of the rollout's log-probs: a FlowGRPO run's rollout takes it, an NFT
    run's (no replay) samples in the no-grad graph."""
    from test_train import debug_config

    from omnialign.rollout import diffusion
    from omnialign.train import main

    velocity, seen = diffusion.rollout_velocity, []
    monkeypatch.setattr(diffusion, "rollout_velocity",
                        lambda policy, config: seen.append(config.grad_graph) or velocity(policy, config))  # fmt: skip
    for algorithm, lora, expected in (("flowgrpo", [], True), ("nft", ["model.lora.rank=4", "rollout.window_size=0"],
                                                               False)):  # fmt: skip
        seen.clear()
        main(debug_config(tmp_path / algorithm, "rollout.grad_graph=true", f"algorithm.name={algorithm}", *lora))
        assert seen and set(seen) == {expected}, (algorithm, seen)
