"""`omnialign prepare offline-dpo` on the tiny SD3 pipeline with real rewards, and its pair reader."""

import dataclasses
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from omnialign.cli import main
from omnialign.config import Config, ModelConfig, RewardConfig, RolloutConfig
from omnialign.data import offline_dpo
from omnialign.data.offline_dpo import PairLoader
from omnialign.engine import dist
from omnialign.models import LOADERS, tiny
from omnialign.prepare.offline_dpo import candidates, prepare_offline_dpo
from omnialign.rewards.base import from_png
from omnialign.rewards.jpeg import jpeg_compressibility

PROMPTS = [
    {"prompt": 'a shop sign that says "OPEN"', "ground_truth": "OPEN"},
    {"prompt": "a red cat"},
    {"prompt": "a blue car at night"},
]
HEIGHT, WIDTH = 16, 24  # tiny SD3: latents (4, 8, 12)
LATENT = (4, 8, 12)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tiny.sd3(tmp_path_factory.mktemp("sd3"))
    return Config(
        model=ModelConfig(arch="sd3", path=str(path)),
        rollout=RolloutConfig(n=3, steps=2, height=HEIGHT, width=WIDTH, guidance=2.0, negative_prompt="blurry"),
        reward=RewardConfig(weights={"jpeg_compressibility": 1.0}),
    )


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


@pytest.fixture(scope="module")
def written(config, prompt_file, tmp_path_factory):
    """One in-process run, 2 prompts per chunk: (output folder, counts)."""
    out = tmp_path_factory.mktemp("pairs")
    return out, prepare_offline_dpo(prompt_file, out, config, chunk_size=2, progress=False)


def rows(out) -> list[dict]:
    tables = [pq.read_table(f) for f in sorted(out.glob("chunk_*.parquet"))]
    return [row for table in tables for row in table.to_pylist()]


def test_prepare_writes_scored_best_and_worst_with_latents_and_conditions(config, prompt_file, written):
    out, counts = written
    assert counts == {"generated": 3, "pairs": 3, "skipped": 0, "chunks": 2, "done_before": 0}
    assert sorted(p.name for p in out.glob("chunk_*")) == ["chunk_00000.parquet", "chunk_00001.parquet"]
    assert json.loads((out / "manifest.json").read_text())["rollout.n"] == 3
    table = pq.read_table(out / "chunk_00000.parquet")
    assert table.num_rows == 4 and pq.ParquetFile(out / "chunk_00000.parquet").metadata.num_row_groups == 2
    assert table.schema.field("latents").metadata == {b"dtype": b"float16", b"shape": b"[4, 8, 12]"}
    all_rows = rows(out)
    assert [r["winner"] for r in all_rows] == [True, False] * 3
    assert [r["prompt_index"] for r in all_rows] == [0, 0, 1, 1, 2, 2]
    assert json.loads(all_rows[0]["metadata"]) == {"ground_truth": "OPEN"}  # the prompt file's metadata
    for row in all_rows:
        assert row["score"] == (max if row["winner"] else min)(row["candidate_scores"])
        assert row["seed"] == row["candidate_seeds"][row["candidate"]]
        image = from_png((out / row["image"]).read_bytes())
        assert image.shape == (3, HEIGHT, WIDTH)
        assert jpeg_compressibility(image[None], [""], [{}])[0] == pytest.approx(row["score"])  # the real reward

    # latents and conditions are what the frozen pipeline gives for these prompts and seeds
    device = dist.init().device  # where prepare ran
    policy = LOADERS["sd3"](config.model).to(device)
    policy.transformer.to(device)
    loader = PairLoader(out, latent_shape=LATENT)
    pairs = loader.read(range(len(loader)))
    prompts = [r["prompt"] for r in all_rows]
    cond = policy.encode_prompts(prompts).cpu()
    negative = policy.encode_prompts(["blurry"])
    one_half_step = dict(atol=2e-3, rtol=2e-3)  # GPU kernels differ in the last bits with the batch size
    for key in ("embeds", "pooled"):
        torch.testing.assert_close(pairs.cond[key], cond[key].half().float(), **one_half_step)
        torch.testing.assert_close(pairs.uncond[key], negative[key].cpu().expand_as(cond[key]).half().float(),
                                   **one_half_step)  # fmt: skip
    one = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, n=1))  # each row from its seed
    _, final, _ = candidates(policy, prompts, pairs.seeds, negative, one, device)
    torch.testing.assert_close(pairs.latents, final.cpu().half().float(), **one_half_step)
    png = np.asarray(Image.open(out / all_rows[0]["image"]))
    decoded = policy.decode(pairs.latents[:1].to(device))[0].permute(1, 2, 0).mul(255).cpu().numpy()
    assert np.abs(png - decoded).max() < 4  # the image is the decoded latent


def test_loader_returns_adjacent_pairs_in_any_order(written):
    out, _ = written
    loader = PairLoader(out)
    assert len(loader) == 3
    pairs = loader.read([2, 0])
    assert pairs.batch_size == torch.Size([4])
    assert pairs.group.tolist() == [2, 2, 0, 0]
    assert pairs.latents.shape == (4, *LATENT) and pairs.latents.dtype == torch.float32
    assert pairs.cond["embeds"].shape[:1] == (4,) and pairs.cond["pooled"].shape == (4, 80)
    assert (pairs.scores[0::2] >= pairs.scores[1::2]).all()
    all_pairs = loader.read([0, 1, 2])
    torch.testing.assert_close(pairs.latents, all_pairs.latents[[4, 5, 0, 1]])
    batches = list(loader.batches(2, seed=0))
    assert [len(b) for b in batches] == [4, 2]
    assert sorted(torch.cat([b.group for b in batches]).tolist()) == [0, 0, 1, 1, 2, 2]


def test_rerun_resumes_and_a_crash_leaves_no_half_chunk(config, prompt_file, written, tmp_path, monkeypatch):
    out, _ = written
    stamps = {f: f.stat().st_mtime_ns for f in out.glob("chunk_*")}
    again = prepare_offline_dpo(prompt_file, out, config, chunk_size=2, progress=False)
    assert again == {"generated": 0, "pairs": 0, "skipped": 0, "chunks": 0, "done_before": 2}
    assert stamps == {f: f.stat().st_mtime_ns for f in out.glob("chunk_*")}

    write_table, calls = pq.write_table, []

    def crash_on_second_chunk(table, where, **kwargs):  # writes half a file, then the process "dies"
        write_table(table, where, **kwargs)
        calls.append(where)
        if len(calls) == 2:
            data = open(where, "rb").read()
            open(where, "wb").write(data[: len(data) // 2])
            raise KeyboardInterrupt

    monkeypatch.setattr(offline_dpo.pq, "write_table", crash_on_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        prepare_offline_dpo(prompt_file, tmp_path, config, chunk_size=2, progress=False)
    monkeypatch.setattr(offline_dpo.pq, "write_table", write_table)
    assert sorted(p.name for p in tmp_path.glob("chunk_*")) == ["chunk_00000.parquet", "chunk_00001.parquet.tmp"]
    assert len(PairLoader(tmp_path)) == 2  # the half chunk is not read
    resumed = prepare_offline_dpo(prompt_file, tmp_path, config, chunk_size=2, progress=False)
    assert resumed == {"generated": 1, "pairs": 1, "skipped": 0, "chunks": 1, "done_before": 1}
    assert rows(tmp_path) == rows(out)  # the same rows as the uninterrupted run


def test_cli_scores_through_a_launched_serve_reward(config, prompt_file, written, tmp_path, capsys):
    out, _ = written
    overrides = ["model.arch=sd3", f"model.path={config.model.path}", "rollout.n=3", "rollout.steps=2",
                 f"rollout.height={HEIGHT}", f"rollout.width={WIDTH}", "rollout.guidance=2.0",
                 "rollout.negative_prompt=blurry", 'reward.weights={"jpeg_compressibility": 1}']  # fmt: skip
    main(["prepare", "offline-dpo", str(prompt_file), str(tmp_path), *overrides, "--chunk-size", "2",
          "--serve-reward", "jpeg_compressibility", "--no-progress"])  # fmt: skip
    assert "3 pairs from 3 prompts in 2 new chunks" in capsys.readouterr().out
    assert rows(tmp_path) == rows(out)  # scored by the server exactly as in process

    with pytest.raises(SystemExit, match=r"'actor.lr' is not a setting of this command"):
        main(["prepare", "offline-dpo", str(prompt_file), str(tmp_path), "actor.lr=1"])
    with pytest.raises(SystemExit, match=r"written with other settings \(rollout.steps=2 there, 3 now\)"):
        main(
            [
                "prepare",
                "offline-dpo",
                str(prompt_file),
                str(tmp_path),
                *overrides,
                "rollout.steps=3",
                "--chunk-size",
                "2",
            ]
        )
    with pytest.raises(SystemExit, match=r"--serve-reward ocr: name a key of reward.weights"):
        main(["prepare", "offline-dpo", str(prompt_file), str(tmp_path), *overrides, "--serve-reward", "ocr"])


def test_empty_prompt_file_fails_before_loading(config, tmp_path):
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match=r"empty.txt holds no prompts"):
        prepare_offline_dpo(tmp_path / "empty.txt", tmp_path / "out", config)


def rewrite(written, tmp_path, edit) -> str:
    """A copy of the pairs with chunk 0's table edited."""
    copy = tmp_path / "pairs"
    shutil.copytree(written[0], copy)
    table = pq.read_table(copy / "chunk_00000.parquet")
    pq.write_table(edit(table), copy / "chunk_00000.parquet")
    return copy


def set_column(table: pa.Table, name: str, values: list, field: pa.Field | None = None) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, field or table.schema.field(name), pa.array(values, table.schema.field(name).type))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.drop_columns(["score"]),
         r"chunk_00000.parquet: missing column 'score'; columns present: \['prompt', 'prompt_index', 'winner'"),
        (lambda t: set_column(t, "latents", t["latents"].to_pylist(),
                              t.schema.field("latents").with_metadata({"dtype": "float16", "shape": "[4, 8, 13]"})),
         r"chunk_00000.parquet row 0: column 'latents' holds 768 bytes, but its stored shape \[4, 8, 13\] of float16 "
         r"needs 832"),
        (lambda t: set_column(t, "score", [1.0, float("nan"), 1.0, 0.0]),
         r"chunk_00000.parquet row 1: the score is NaN or infinite"),
        (lambda t: t.slice(0, 3), r"chunk_00000.parquet: an odd number of rows \(3\)"),
        (lambda t: set_column(t, "winner", [False, True, True, False]),
         r"chunk_00000.parquet row 0: rows must alternate winner \(true\) then loser \(false\)"),
        (lambda t: set_column(t, "score", [0.0, 1.0, 1.0, 0.0]), r"chunk_00000.parquet row 1: the loser scores above"),
    ],
)  # fmt: skip
def test_loader_rejects_bad_files_up_front(written, tmp_path, edit, message):
    with pytest.raises(ValueError, match=message):
        PairLoader(rewrite(written, tmp_path, edit))


def test_a_chunk_cut_short_is_named(written, tmp_path):
    data = (written[0] / "chunk_00000.parquet").read_bytes()
    (tmp_path / "chunk_00000.parquet").write_bytes(data[: len(data) // 2])  # a copy that stopped halfway
    with pytest.raises(ValueError, match=r"chunk_00000.parquet: not a readable parquet file \(.*\); copy it again"):
        PairLoader(tmp_path)


def test_loader_rejects_a_latent_shape_the_run_does_not_expect(written):
    with pytest.raises(ValueError, match=r"latents have shape \[4, 8, 12\] but this run expects \[4, 16, 16\]"):
        PairLoader(written[0], latent_shape=(4, 16, 16))
    with pytest.raises(FileNotFoundError, match="holds no chunk_\\*.parquet files"):
        PairLoader(written[0] / "images")


def test_conditions_of_a_wrong_stored_shape_fail_when_read(written, tmp_path):
    field = pa.field("cond_pooled", pa.binary(), metadata={"dtype": "float16", "shape": "[81]"})
    copy = rewrite(written, tmp_path, lambda t: set_column(t, "cond_pooled", t["cond_pooled"].to_pylist(), field))
    with pytest.raises(ValueError, match=r"cond_pooled \[80\] float16.* differ from .*cond_pooled \[81\] float16"):
        PairLoader(copy)  # the files disagree
    loader = PairLoader(copy / "chunk_00000.parquet")  # one file is only checked as it is read
    with pytest.raises(
        ValueError, match=r"chunk_00000.parquet row 2: column 'cond_pooled' holds 160 bytes, but .*\[81\]"
    ):
        loader.read([1])
