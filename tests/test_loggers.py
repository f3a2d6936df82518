"""trainer.loggers: a glyphs run logs to every installed tracker offline and is resumed; each tracker's record, read
back with the tracker's own reader, holds metrics.jsonl's scalars at the same steps, the validation grids and the
config, all in one tracker run."""

import json
import struct
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from omnialign.config import LOGGERS, Config, ConfigError, apply_overrides, flat_values, to_dict, validate
from omnialign.metrics import read_metrics
from omnialign.recipes import RECIPES
from omnialign.train import main

SMALL = ["data.prompts_per_step=2", "rollout.n=2", "rollout.steps=4", "rollout.val_steps=4", "data.val_seeds=1",
         "rollout.window_size=2", "rollout.window_shift_every=1", "rollout.window_end=3", "trainer.val_every=1",
         "trainer.save_every=1", "trainer.progress=false", "actor.mini_batch_size=none", "actor.micro_batch_size=4",
         "trainer.project=omnialign-test"]  # fmt: skip


def wandb_records(path: Path):
    """The records of a .wandb transaction log (a LevelDB-format log of wandb's own protobuf `Record`s)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, block, pos, chunks = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunks, pos = chunks + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def read_wandb(run_dir: Path) -> tuple[set[str], dict[int, dict], list[dict]]:
    """(run ids, {step: logged values}, the config of each segment) of the run's offline wandb logs."""
    ids, rows, configs = set(), {}, []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
                configs.append({i.key: json.loads(i.value_json) for i in record.run.config.update if i.key != "_wandb"})
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                rows.setdefault(row["_step"], {}).update(row)
                if row.get("val/samples/_type") == "image-file":
                    assert (path.parent / "files" / row["val/samples/path"]).is_file()
    return ids, rows, configs


def read_trackio(project: str, run_id: str) -> tuple[dict[int, dict], dict]:
    from trackio.sqlite_storage import SQLiteStorage

    rows = {}
    for row in SQLiteStorage.get_logs(project, run_id=run_id):
        rows.setdefault(row["step"], {}).update(row)
    (name,) = SQLiteStorage.get_runs(project)  # one run: the resumed run did not start another
    config = {k: v for k, v in SQLiteStorage.get_run_config(project, name).items() if not k.startswith("_")}
    return rows, config


def read_swanlab(run_dir: Path) -> tuple[set[str], dict[int, dict], list[dict]]:
    """(run ids, {step: logged values}, the config of each segment) of the run's offline SwanLab logs."""
    import yaml
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    ids, rows = set(), {}
    for path in sorted(run_dir.glob("swanlog/run-*/run-*.swanlab")):
        reader = DataStoreReader()
        reader.open(path)
        for data in reader:
            record = Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "start":
                ids.add(record.start.id)
            elif kind == "scalar":
                rows.setdefault(record.scalar.step, {})[record.scalar.key] = record.scalar.value.number
            elif kind == "media":
                rows.setdefault(record.media.step, {})[record.media.key] = record.media.value.items[0].filename
                assert (path.parent / "media" / "image" / record.media.value.items[0].filename).is_file()
        reader.close()
    configs = [yaml.safe_load(path.read_text()) for path in sorted(run_dir.glob("swanlog/run-*/files/config.yaml"))]
    return ids, rows, [{k: v["value"] for k, v in config.items()} for config in configs]


def read_mlflow(run_dir: Path, run_id: str, keys: list[str]) -> tuple[dict[int, dict], dict, list[str], int]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    rows = {}
    for key in keys:
        for m in client.get_metric_history(run_id, key):
            assert m.step not in rows.get(key, {}), f"{key} logged twice at step {m.step}"
            rows.setdefault(m.step, {})[key] = m.value
    run = client.get_run(run_id)
    images = [a.path for a in client.list_artifacts(run_id, "images") if a.path.endswith(".png")]
    runs = client.search_runs([run.info.experiment_id])
    return rows, run.data.params, images, len(runs)


def read_tensorboard(run_dir: Path) -> tuple[dict[int, dict], list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={IMAGES: 0})
    acc.Reload()
    rows = {}
    for key in acc.Tags()["scalars"]:
        for event in acc.Scalars(key):
            rows.setdefault(event.step, {})[key] = event.value
    return rows, [event.step for event in acc.Images("val/samples")]


def assert_same_scalars(records: list[dict], rows: dict[int, dict], who: str, approx: bool = False) -> None:
    assert sorted(rows) == [r["step"] for r in records], who
    for record in records:
        expected = {k: v for k, v in record.items() if k != "step"}
        got = {k: rows[record["step"]][k] for k in expected}
        assert got == (pytest.approx(expected, rel=1e-6) if approx else expected), f"{who} step {record['step']}"


@pytest.mark.skipif(not (find_spec("wandb") and find_spec("trackio")), reason="the dev extra installs wandb and "
                    "trackio (CI and `make test` have them; the GPU tier's image does not)")  # fmt: skip
def test_trackers_log_what_metrics_jsonl_holds_and_resume_into_the_same_run(tmp_path, monkeypatch):
    for name, value in {"WANDB_MODE": "offline", "SWANLAB_MODE": "offline", "TRACKIO_DIR": str(tmp_path / "trackio"),
                        "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "MLFLOW_TRACKING_URI", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert "trackio" not in sys.modules, "trackio reads TRACKIO_DIR when imported: it must not be imported before"
    loggers = ["tensorboard", "wandb", "trackio"] + [n for n in ("swanlab", "mlflow") if find_spec(n)]
    overrides = [*SMALL, f"trainer.output_dir={tmp_path}", f"trainer.loggers={','.join(loggers)}"]

    first = validate(apply_overrides(RECIPES["glyphs"](), [*overrides, "trainer.total_steps=1"]))
    main(first)
    run_dir = tmp_path / first.name
    ids = json.loads((run_dir / "trackers.json").read_text())
    assert sorted(ids) == sorted(n for n in loggers if n != "tensorboard")
    config = validate(apply_overrides(RECIPES["glyphs"](), [*overrides, "trainer.total_steps=2"]))
    main(config, resume="auto")  # steps 2 and its validation, into the same tracker runs
    assert json.loads((run_dir / "trackers.json").read_text()) == ids
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2] and all("val/reward/mean" in r for r in records)
    saved = to_dict(config)

    for _ in range(60):  # wandb's service process can still be writing a segment's log when finish() has returned
        run_ids, rows, configs = read_wandb(run_dir)
        if len(configs) == 2 and 2 in rows:
            break
        time.sleep(0.5)
    assert run_ids == {ids["wandb"]} and len(configs) == 2  # two offline segments of one run
    assert_same_scalars(records, rows, "wandb")
    assert all(rows[s]["val/samples/_type"] == "image-file" for s in (0, 1, 2))
    assert configs == json.loads(json.dumps([to_dict(first), saved]))

    rows, logged_config = read_trackio("omnialign-test", ids["trackio"])
    assert_same_scalars(records, rows, "trackio")
    assert all(rows[s]["val/samples"]["_type"] == "trackio.image" for s in (0, 1, 2))
    assert logged_config == json.loads(json.dumps(saved))  # trackio keeps the latest config of a run

    rows, images = read_tensorboard(run_dir)
    assert_same_scalars(records, rows, "tensorboard", approx=True)  # TensorBoard keeps float32
    assert images == [0, 1, 2]

    if "swanlab" in loggers:
        run_ids, rows, configs = read_swanlab(run_dir)
        assert run_ids == {ids["swanlab"]}
        assert_same_scalars(records, rows, "swanlab")
        assert all(rows[s]["val/samples"].endswith(".png") for s in (0, 1, 2))
        assert configs == json.loads(json.dumps([to_dict(first), saved]))
    if "mlflow" in loggers:
        keys = sorted({k for r in records for k in r if k != "step"})
        rows, params, images, runs = read_mlflow(run_dir, ids["mlflow"], keys)
        assert runs == 1
        assert_same_scalars(records, rows, "mlflow")
        assert params == {k: str(v) for k, v in flat_values(to_dict(first)).items()}
        assert sorted(int(p.split("+step+")[1].split("+")[0]) for p in images) == [0, 1, 2]


def test_loggers_are_checked_before_anything_loads(monkeypatch):
    config = Config()
    config.trainer.loggers = ["tensorboard", "neptune"]
    with pytest.raises(ConfigError, match="trainer.loggers=.*'neptune' is not one of tensorboard, wandb"):
        validate(config)
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails as if it were not installed
    config.trainer.loggers = ["wandb"]
    with pytest.raises(ConfigError, match=r"wandb is not installed; pip install 'omnialign\[wandb\]'"):
        validate(config)
    config.trainer.loggers = [n for n in LOGGERS if n != "wandb" and find_spec(n)]
    validate(config)


def test_a_failing_tracker_is_switched_off_and_the_run_finishes(tmp_path, monkeypatch, capsys):
    """A tracker that raises while logging (here at step 2) or at close warns and is switched off: the run goes
    on, saves every checkpoint and writes its summary, and metrics.jsonl keeps every step (before, a raise in
    `log` killed the run before that step's checkpoint and one in `close` turned a finished run into exit 1)."""
    from omnialign import metrics, trackers

    class Flaky(trackers.TensorBoard):
        def log(self, step, values, images):
            if step == 2:
                raise ConnectionError("tracker server went away")
            super().log(step, values, images)

    class FailsAtClose(trackers.TensorBoard):
        def close(self):
            raise RuntimeError("cannot finish")

    monkeypatch.setitem(metrics.SINKS, "tensorboard", Flaky)
    config = validate(
        apply_overrides(
            RECIPES["glyphs"](),
            [*SMALL, f"trainer.output_dir={tmp_path}", "trainer.total_steps=3", "trainer.loggers=tensorboard"],
        )
    )
    summary = main(config)
    assert summary["steps"] == 3 and (tmp_path / "glyphs" / "summary.json").exists()
    assert [r["step"] for r in read_metrics(tmp_path / "glyphs" / "metrics.jsonl")] == [0, 1, 2, 3]
    assert "tensorboard failed to log (ConnectionError: tracker server went away); it is switched off" in (
        capsys.readouterr().out
    )
    monkeypatch.setitem(metrics.SINKS, "tensorboard", FailsAtClose)
    summary = main(apply_overrides(config, [f"trainer.output_dir={tmp_path / 'b'}"]))
    assert summary["steps"] == 3 and "tensorboard failed to close (RuntimeError: cannot finish)" in (
        capsys.readouterr().out
    )


def test_metrics_jsonl_holds_json_for_nan_and_infinity(tmp_path):
    """A NaN or infinite metric is written as null: every line parses as strict JSON (bare NaN is not JSON)."""
    from omnialign.metrics import MetricsLog

    log = MetricsLog(tmp_path, validate(RECIPES["glyphs"]()))
    log.log(1, {"actor/loss": float("nan"), "reward/mean": float("inf"), "actor/lr": 1e-4}, echo=lambda line: None)

    def strict(constant):
        raise ValueError(f"{constant} is not JSON")

    line = (tmp_path / "metrics.jsonl").read_text()
    assert json.loads(line, parse_constant=strict) == {"step": 1, "actor/loss": None, "reward/mean": None,
                                                       "actor/lr": 1e-4}  # fmt: skip
