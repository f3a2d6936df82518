"""Regional compile (`engine.compile`): a block keeps compiled graphs for more batch shapes than dynamo's default."""

import torch
from torch._dynamo.utils import counters

from omnialign.engine.fsdp import compile_forward


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
