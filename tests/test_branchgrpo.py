"""BranchGRPO (docs/algorithms.md): its tree rollout on the glyphs model, the depth-wise advantages of mean-fused
node rewards against hand values and against the reference's formula, pruning, and its config refusals."""

import re

import pytest
import torch

from omnialign.algorithms import branching
from omnialign.config import ConfigError, apply_overrides, training_batch, tree_rows, validate
from omnialign.recipes import RECIPES

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the run's, as dist.init picks it


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def config_of(*overrides: str):
    base = ["actor.mini_batch_size=null", "algorithm.kl_coef=0", "rollout.micro_batch_size=64", "rollout.height=16",
            "rollout.width=16"]  # fmt: skip
    return validate(apply_overrides(RECIPES["glyphs_branch"](), [*base, *overrides]))


@pytest.fixture(scope="module")
def policy():
    from omnialign.engine import dist
    from omnialign.trainer.build import build_policy

    return build_policy(config_of(), dist.init())[0]


def grow(policy, config, prompts=("3", "7"), seeds=(11, 12)):
    from omnialign.rollout.branching import generate_tree

    n = len(prompts)
    return generate_tree(policy, list(prompts), torch.arange(n), torch.tensor(seeds), config.rollout, DEVICE)


def batch(policy, config, tree, leaf_rewards):
    from omnialign.trainer.objectives import branchgrpo

    tree.rewards = leaf_rewards.to(DEVICE)
    return branchgrpo(policy, config, None, None, None).batch(tree, 0)


def test_depth_advantages_of_a_hand_tree(policy):
    """3 steps, splits at 0 and 1: 2 nodes at depth 1, 4 at depths 2 and 3. Leaf rewards 1, 0, .25, .25: depth 1
    fuses to .5 and .25 (A = +-.125 / (unbiased std .1768 + 1e-4)), depths 2 and 3 are the leaves (mean .375, the
    unbiased std .4330); each edge carries its child's advantage; the second tree's tied leaves get 0 everywhere."""
    config = config_of("rollout.steps=3", "rollout.split_steps=[0,1]")
    tree, _ = grow(policy, config)
    rows = batch(policy, config, tree, t(1.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.5, 0.5))
    assert tree.leaf_range[:10].tolist() == [[0, 2], [2, 4], *[[i, i + 1] for i in range(4)] * 2]
    leaves = t(1.4430, -0.8658, -0.2886, -0.2886)  # (1 - .375) / (.4330 + 1e-4), ...
    torch.testing.assert_close(rows.advantages[:10].cpu(), torch.cat([t(0.7067, -0.7067), leaves, leaves]), rtol=0,
                               atol=1e-4)  # fmt: skip
    torch.testing.assert_close(rows.advantages[10:].cpu(), torch.zeros(10))


def test_tree_rollout_structure_log_probs_and_seeds(policy):
    """4 steps, splits at 0 and 2, children's noise 4x wider: 4 leaves a tree, 2 + 2 + 4 + 4 rows. A row's log-prob
    is its transition's replayed under the policy (scored with the unscaled std); split children sit 4 stds from
    their mean, the others 1; each row starts from its parent's sample (siblings share it); the last rows' samples
    are the leaves, depth-first; a tree's leaves depend on its own seed only (the same alone as beside another)."""
    from omnialign.diffusion import sde

    config = config_of("rollout.steps=4", "rollout.split_steps=[0,2]", "rollout.split_noise_scale=4")
    r = config.rollout
    tree, images = grow(policy, config)
    rows = tree.rows
    assert images.shape[0] == 8 and len(rows) == 24 == 2 * tree_rows(config)
    assert tree.row_step[:12].tolist() == [0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    assert tree.row_group.tolist() == [4 * i + k for i in range(2) for k in tree.row_step[:12].tolist()]
    sigmas = policy.schedule(4, r.height, r.width).to(DEVICE)
    torch.testing.assert_close(rows.sigmas[:12], torch.stack([sigmas[:4], sigmas[1:]], 1)[tree.row_step[:12]])
    x, x_next, sigma = rows.latents[:, 0], rows.latents[:, 1], rows.sigmas[:, 0]
    tr = sde.transition(r.kind, policy.velocity(x, sigma, rows.cond), x, sigma, rows.sigmas[:, 1], r.eta,
                        sample=x_next)  # fmt: skip
    torch.testing.assert_close(tr.log_prob, rows.log_probs[:, 0], rtol=0, atol=1e-5)
    spread = ((x_next - tr.mean) / tr.std[:, None, None, None]).pow(2).mean((1, 2, 3)).sqrt()
    split = torch.isin(tree.row_step, torch.tensor([0, 2], device=DEVICE))
    assert (spread[split] - 4).abs().max() < 0.5 and (spread[~split] - 1).abs().max() < 0.2
    starts, ends = x.view(2, 12, -1), x_next.view(2, 12, -1)
    torch.testing.assert_close(starts[:, 0], starts[:, 1], rtol=0, atol=0)  # the root's two children
    for i, p in enumerate([0, 1, 2, 2, 3, 3, 4, 5, 6, 7], start=2):  # each row's parent row in its tree
        torch.testing.assert_close(starts[:, i], ends[:, p], rtol=0, atol=0)
    assert not torch.equal(x_next[0], x_next[1]) and not torch.equal(x_next[4], x_next[5])
    last = tree.row_step == 3
    torch.testing.assert_close(rows.final[last], x_next[last], rtol=0, atol=0)
    torch.testing.assert_close(rows.final[1], x_next[last][2], rtol=0, atol=0)  # the first leaf below it
    assert tree.leaf_range[:12].tolist() == [[0, 2], [2, 4]] * 2 + [[i, i + 1] for i in range(4)] * 2
    torch.testing.assert_close(policy.decode(x_next[last]), images)
    _, again = grow(policy, config, ("7", "7"), (12, 99))  # the second tree first, then another seed
    torch.testing.assert_close(again[:4], images[4:], rtol=0, atol=1e-5)
    assert (again[4:] - again[:4]).abs().max() > 0.1


def test_pruning_keeps_the_expected_rows(policy):
    """Depth pruning [2] drops step 1's rows; width pruning 0.5 drops, of each tree's 2 x 4 rows after the last split
    (steps 3 and 4), the 4 whose advantages lie in the middle: the top 2 and bottom 2 remain (ties in row order),
    the best and the worst leaf's. The count is training_batch's."""
    config = config_of("rollout.steps=5", "rollout.split_steps=[0,2]", "algorithm.branch_depth_pruning=[2]",
                       "algorithm.branch_width_pruning=0.5", "data.prompts_per_step=2")  # fmt: skip
    tree, _ = grow(policy, config)
    rows = batch(policy, config, tree, t(0.6, 0.9, 0.1, 0.3, 0.2, 0.4, 0.8, 0.5))
    per_tree = len(tree.rows) // 2  # 2 + 2 + 4 + 4 + 4
    assert len(rows) == training_batch(config)[0] == 2 * (per_tree - 2 - 4) and per_tree == 16
    kept_leaf = rows.final.view(2, 10, -1)[:, -4:]  # the kept rows of steps 3 and 4, by step then node
    leaves = tree.rows.final.view(2, per_tree, -1)[:, -4:]  # the leaves, in tree order
    torch.testing.assert_close(kept_leaf[0], leaves[0, [1, 2, 1, 2]])  # the best (0.9) and worst (0.1) leaves
    torch.testing.assert_close(kept_leaf[1], leaves[1, [0, 2, 0, 2]])  # 0.2 and 0.8: in row order
    steps = tree.row_step.view(2, per_tree)
    keep = branching.prune(rows.advantages.new_zeros(2, per_tree), steps, [2], after=2, share=0.5)
    assert keep.sum(1).tolist() == [10, 10] and not keep[:, 2:4].any()  # all tied: the first 2 and the last 2
    assert keep[:, 8:].tolist() == [[True, True, False, False, False, False, True, True]] * 2


def reference_edge_advantages(steps, splits, factor, leaf_rewards):
    """The reference's depth-wise advantages (train_branchgrpo_flux.py, compute_node_rewards_from_leaves and
    compute_hierarchical_advantages_by_depth), re-derived on a tree of nodes: one tree grown as
    run_tree_sample_step grows it, node rewards the mean of their leaf descendants, then per depth
    (r - mean) / (unbiased std + 1e-8), 0 for a lone node or a std below 1e-6. Returns the advantage of each edge
    by (step, position of its child in its level)."""
    root = {"children": []}
    level = [root]
    for k in range(steps):
        new = []
        for node in level:
            for _ in range(factor if k in splits else 1):
                child = {"children": [], "step": k}
                node["children"].append(child)
                new.append(child)
        level = new
    for leaf, reward in zip(level, leaf_rewards):
        leaf["reward"] = reward

    def leaves(node):
        return [node] if not node["children"] else [leaf for c in node["children"] for leaf in leaves(c)]

    edges, level = {}, [root]
    for k in range(steps):
        level = [c for node in level for c in node["children"]]
        rewards = torch.stack([torch.stack([leaf["reward"] for leaf in leaves(node)]).mean() for node in level])
        if len(level) <= 1 or rewards.std() < 1e-6:
            advantages = torch.zeros_like(rewards)
        else:
            advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        edges[k] = advantages
    return edges


def test_depth_advantages_match_the_reference_formula_on_random_trees(policy):
    g = torch.Generator().manual_seed(0)
    for steps, splits, factor in [(4, [0, 2], 2), (5, [1, 2, 4], 2), (3, [0, 1], 3), (4, [3], 3)]:
        config = config_of(f"rollout.steps={steps}", f"rollout.split_steps={splits}", f"rollout.split_factor={factor}")
        tree, images = grow(policy, config)
        leaf_rewards = torch.rand(len(images), generator=g)
        rows = batch(policy, config, tree, leaf_rewards)
        per = len(images) // 2
        for i in range(2):
            edges = reference_edge_advantages(steps, splits, factor, leaf_rewards[i * per : (i + 1) * per])
            ours = rows.advantages.view(2, -1)[i].cpu()
            expected = torch.cat([edges[k] for k in range(steps)])
            torch.testing.assert_close(ours, expected, rtol=1e-3, atol=1e-3)


def test_counts_and_refusals():
    config = validate(RECIPES["glyphs_branch"]())
    assert training_batch(config)[0] == 8 * (2 + 2 + 4 + 4 + 8 * 6)
    pruned = validate(apply_overrides(RECIPES["glyphs_branch"](), ["algorithm.branch_depth_pruning=[1,2]",
                                      "algorithm.branch_width_pruning=0.5", "actor.mini_batch_size=null"]))  # fmt: skip
    assert training_batch(pruned)[0] == 8 * (56 - 20)  # depths 1, 2 hold 2 + 2; 20 of the 40 after step 4 go
    for overrides, match in [
        (["rollout.split_factor=1"], "rollout.split_factor=1: BranchGRPO compares the children"),
        (["rollout.split_steps=[]"], "rollout.split_steps=[]: at least one"),
        (["rollout.split_steps=[2,10]"], "rollout.split_steps=[2, 10]: at least one, distinct step indices in [0, "
                                         "rollout.steps=10)"),
        (["rollout.split_steps=[2,2]"], "rollout.split_steps=[2, 2]"),
        (["rollout.split_noise_scale=0"], "rollout.split_noise_scale=0.0 must be > 0"),
        (["algorithm.branch_depth_pruning=[0]"], "algorithm.branch_depth_pruning=[0]: child depths in [1, "
                                                 "rollout.steps=10]"),
        (["algorithm.branch_width_pruning=1"], "algorithm.branch_width_pruning=1.0: a share in [0, 1)"),
        ([f"algorithm.branch_depth_pruning={list(range(1, 11))}"], "prune every edge of the tree"),
        (["rollout.kind=cps"], "rollout.kind=cps has no noise on the last step (sigma'=0): leave step 9 out of "
                               "rollout.split_steps and add depth 10 to algorithm.branch_depth_pruning"),
        (["actor.mini_batch_size=100"], "actor.mini_batch_size=100 must divide the training batch 480 (edges"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(match)):
            validate(apply_overrides(RECIPES["glyphs_branch"](), overrides))
    validate(apply_overrides(RECIPES["glyphs_branch"](), ["rollout.kind=cps", "algorithm.branch_depth_pruning=[10]",
                                                          "actor.mini_batch_size=null"]))  # fmt: skip
