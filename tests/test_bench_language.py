"""`omnialign bench language --tiny`: offline DPO on the tiny Qwen3-Omni thinker and GSPO on a tiny Qwen3, on the CPU,
through the same code the GPU run takes (random model built in memory, the recipe's trainer, synthetic data)."""

import json

import pytest
import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoder,
    Qwen3OmniMoeVisionEncoder,
)

from omnialign.bench.decode import DECODERS, nominal_bandwidth
from omnialign.bench.models import language_policy
from omnialign.cli import main as cli
from omnialign.data.language import read_records
from omnialign.models.qwen3_omni import find

COMMON = {"recipe", "model", "params_b", "trainable_m", "gpus", "step", "step_s", "samples_per_gpu_s", "update_s",
          "peak_alloc_gb"}  # fmt: skip
KEYS = {
    "dpo": COMMON | {"pairs", "seq_len", "pairs_per_gpu_s", "data_s", "reference_s", "media", "towers"},
    "gspo": COMMON | {"samples", "prompt_len", "max_new_tokens", "response_len", "gen_tokens_per_s", "rollout_s",
                      "reward_s", "advantage_s", "media", "gen_share", "step_tokens_per_gpu_s"},
}  # fmt: skip
KEYS["gspo_replay"] = KEYS["gspo"] | {"old_log_probs_s", "rollout_logprob_gap"}
GSPO = ["--recipe", "choice_gspo", "--prompt-len", "24", "--max-new-tokens", "6", "--prompts", "2", "--set",
        "model.lora.rank=4", "model.lora.alpha=8"]  # fmt: skip


@pytest.mark.parametrize(
    "kind, args",
    [
        ("dpo", ["--recipe", "qwen3_omni_dpo", "--seq-len", "48", "--prompts", "2"]),
        ("dpo", ["--recipe", "qwen3_omni_dpo", "--seq-len", "500", "--prompts", "2", "--media", "video"]),
        ("gspo", GSPO),
        ("gspo_replay", [*GSPO, "algorithm.old_log_probs=recompute"]),
    ],
)  # fmt: skip
def test_bench_language_tiny_rows(kind, args, tmp_path, capsys):
    out = tmp_path / f"{kind}.json"
    cli(["bench", "language", "--tiny", "--steps", "2", "--work", str(tmp_path / "work"), "--out", str(out), *args])
    rows = json.loads(out.read_text())["rows"]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert set(row) == KEYS[kind], set(row) ^ KEYS[kind]
        assert row["samples_per_gpu_s"] > 0 and row["step_s"] > 0 and row["trainable_m"] > 0
    if kind == "dpo":
        assert rows[0]["model"] == "tiny-qwen3_omni" and rows[0]["pairs"] == 2 and rows[0]["pairs_per_gpu_s"] > 0
        assert rows[0]["towers"] == "shrunk"
    else:
        assert rows[0]["samples"] == 8 and 0 < rows[0]["response_len"] <= 6 and rows[0]["gen_tokens_per_s"] > 0
        rollout, step = rows[0]["rollout_s"], rows[0]["step_s"]  # each rounded to 0.01 s: the share within that
        low, high = (rollout - 0.005) / (step + 0.005), (rollout + 0.005) / (step - 0.005)
        assert low - 1e-3 <= rows[0]["gen_share"] <= high + 1e-3, (rollout, step, rows[0]["gen_share"])
        n, length = rows[0]["samples"], rows[0]["response_len"]  # over the whole step; length and time are rounded
        low, high = n * (length - 0.05) / (step + 0.005), n * (length + 0.05) / (step - 0.005)
        assert low - 0.1 <= rows[0]["step_tokens_per_gpu_s"] <= high + 0.1
    if kind == "gspo_replay":  # the float32 static decoder records the training forward's log-probs (merged LoRA too)
        assert all(r["rollout_logprob_gap"] < 1e-5 for r in rows), rows
    if "--media" in args:  # a random clip first in every prompt, its tokens within the prompt's half of --seq-len
        assert rows[0]["media"] == "video"
        policy = language_policy("qwen3_omni", "tiny", torch.device("cpu"), torch.float32)
        records = read_records(tmp_path / "work" / "language.parquet", "train")
        ids, media = policy.encode([r["prompt"] for r in records])
        video = policy.tokenizer.convert_tokens_to_ids("<|video_pad|>")
        assert [len(i) for i in ids] == [250, 250] and [i.count(video) for i in ids] == [196, 196]
        assert all(m["video_grid_thw"].tolist() == [[4, 14, 14]] for m in media)
    assert "samples_per_gpu_s" in capsys.readouterr().out  # the table


def test_full_size_configs_have_the_released_parameter_counts():
    """Built on the meta device: the thinker of Qwen3-Omni-30B-A3B (its text stack 30.5 B; the audio tower 0.65 B,
    the size Qwen3-Omni's report gives its AuT encoder, and the vision tower 0.54 B, SigLIP2-So400m's size) and the
    released Qwen3 sizes (embeddings included)."""
    billions = lambda module: round(sum(p.numel() for p in module.parameters()) / 1e9, 2)  # noqa: E731
    expected = {("qwen3", "0.6b"): 0.60, ("qwen3", "4b"): 4.02, ("qwen3", "8b"): 8.19}
    for (arch, size), count in expected.items():
        assert billions(language_policy(arch, size, torch.device("meta"), torch.bfloat16).transformer) == count
    shrunk = language_policy("qwen3_omni", "30b-a3b", torch.device("meta"), torch.bfloat16, towers="shrunk")
    assert billions(shrunk.transformer) == 30.53
    full = language_policy("qwen3_omni", "30b-a3b", torch.device("meta"), torch.bfloat16)
    audio, vision = find(full.transformer, Qwen3OmniMoeAudioEncoder), find(full.transformer, Qwen3OmniMoeVisionEncoder)
    assert (billions(audio), billions(vision), billions(full.transformer)) == (0.65, 0.54, 31.72)


def test_bench_decode_tiny_rows(tmp_path):
    """`omnialign bench decode --tiny`: one row per decoder, then the reference row of a bf16 head; every decoder's
    log-probs are the training forward's (float32 here, where a bf16 head changes nothing either); `--profile` adds
    each static decoder's operators by kind for 2 and 18 tokens and one decode step's share by kind (the CPU has
    no graph: eager three times)."""
    out = tmp_path / "decode.json"
    cli(["bench", "decode", "--tiny", "--prompts", "4", "--prompt-len", "16", "--max-new-tokens", "6", "--out",
         str(out), "--profile", str(tmp_path / "prof")])  # fmt: skip
    for name in ("eager", "graph", "compiled"):
        for tokens in (2, 18):
            summary = json.loads((tmp_path / "prof" / name / f"tokens_{tokens}" / "kernels.json").read_text())
            assert summary["device_ms"] > 0 and "matmul" in summary["kinds"], summary
        step = json.loads((tmp_path / "prof" / name / "step.json").read_text())
        assert step["decoder"] == DECODERS[name], step
        if step["wall_ms_per_step"] is not None:  # None where the timing noise of a tiny model swamps a step
            assert "matmul" in step["kinds_ms_per_step"] and step["device_ms_per_step"] > 0, step
    rows = json.loads(out.read_text())["rows"]
    assert [r["decoder"] for r in rows] == ["transformers generate, dynamic cache",
                                            "omnialign static cache, eager step", "omnialign static cache, CUDA graph",
                                            "omnialign static cache, compiled step, CUDA graph",
                                            "training forward, bf16 head (reference)"]  # fmt: skip
    for row in rows[:-1]:
        assert row["batch"] == 4 and 1 <= row["new_tokens"] <= 6 and row["tokens_per_s"] > 0
        assert row["bound_tokens_per_s"] > 0 and row["logprob_gap_max"] < 1e-4, row  # speeds: benchmarks, not tests
        assert row["bandwidth_tb_s"] == 4.8  # --tiny's stand-in
        assert row["seq_gap_max"] < 1e-4 and row["gspo_clipped"] == 0, row
    assert rows[-1]["logprob_gap_max"] < 1e-4 and rows[-1]["batch"] is None


@pytest.mark.parametrize("name, expected", [("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H200", 4.8),
                                            ("NVIDIA A100-SXM4-80GB", None)])  # fmt: skip
def test_decode_bound_uses_the_cards_nominal_bandwidth(monkeypatch, name, expected):
    """`bench decode` without --bandwidth bounds the decode rate by the card's own nominal bandwidth (an H100 run was
    once read against an H200's), and names the flag for a card it does not know."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: name)
    if expected is None:
        with pytest.raises(ValueError, match="A100.*--bandwidth"):
            nominal_bandwidth(torch.device("cuda"))
    else:
        assert nominal_bandwidth(torch.device("cuda")) == expected
