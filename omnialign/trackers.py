"""Experiment trackers (`trainer.loggers`): one small sink per tracker over the tracker's own API.

Every sink receives what metrics.jsonl receives, at the same steps, plus the validation grids as images; the
trackers with a run config get the run's full config. A tracker's run id is kept in the run folder
(`trackers.json`), so that a resumed run (`--resume`) reopens the same tracker run. By default every tracker
writes offline or locally; its usual environment variables point it online (docs/tracking.md).
"""

import os
import time
from pathlib import Path

import numpy as np
from PIL import Image

from omnialign.config import flat_values

IDS = "trackers.json"
"""The file of the run folder that keeps each tracker's run id ({logger: id})."""
FILES = ("tensorboard", "wandb", "swanlog", "mlflow.db", "mlartifacts", IDS)
"""What the trackers write in the run folder (removed when a run starts afresh); trackio keeps its own folder."""


class TensorBoard:
    def __init__(self, run_dir: Path, project: str, name: str, config: dict, run_id: str | None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer, self.id = SummaryWriter(str(run_dir / "tensorboard")), None

    def log(self, step: int, metrics: dict[str, float], images: dict[str, Path]) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        for k, path in images.items():
            self.writer.add_image(k, np.asarray(Image.open(path).convert("RGB")), step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class RunSink:
    """A tracker whose run takes `log({key: scalar or image}, step=)` and `finish()`; `image` wraps a PNG path."""

    run, image, id = None, None, None

    def log(self, step: int, metrics: dict[str, float], images: dict[str, Path]) -> None:
        self.run.log({**metrics, **{k: self.image(str(path)) for k, path in images.items()}}, step=step)

    def close(self) -> None:
        self.run.finish()


class WandB(RunSink):
    """Offline unless WANDB_MODE says otherwise (`wandb sync RUN_DIR/wandb/offline-run-*` uploads later)."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict, run_id: str | None):
        import wandb

        mode = os.environ.get("WANDB_MODE", "offline")
        self.run = wandb.init(project=project, name=name, config=config, dir=run_dir, id=run_id,
                              resume="allow" if run_id else None, mode=mode)  # fmt: skip
        self.image, self.id = wandb.Image, self.run.id


class Trackio(RunSink):
    """In trackio's local database (TRACKIO_DIR) unless TRACKIO_SPACE_ID or TRACKIO_SERVER_URL points elsewhere;
    trackio reopens a run by its name (the newest run of that name in the project)."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict, run_id: str | None):
        import trackio

        self.run = trackio.init(project=project, name=name, config=config, resume="allow" if run_id else "never",
                                embed=False)  # fmt: skip
        self.image, self.id = trackio.Image, self.run.id

    def close(self) -> None:
        import trackio

        trackio.finish()  # also forgets the current run, which trackio would otherwise finish again at exit


class SwanLab(RunSink):
    """Offline under RUN_DIR/swanlog unless SWANLAB_MODE says otherwise (`swanlab sync RUN_DIR/swanlog/run-*`)."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict, run_id: str | None):
        import swanlab

        self.run = swanlab.init(project=project, name=name, config=config, log_dir=str(run_dir / "swanlog"),
                                mode=os.environ.get("SWANLAB_MODE", "offline"), id=run_id,
                                resume="allow" if run_id else "never", reinit=True)  # fmt: skip
        self.image, self.id = swanlab.Image, self.run.id


class MLflow:
    """In RUN_DIR/mlflow.db (SQLite, artifacts in RUN_DIR/mlartifacts) unless MLFLOW_TRACKING_URI names a store or
    server; the config goes in as the run's parameters (dotted keys), once, when the run is created."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict, run_id: str | None):
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.client = MlflowClient(uri or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
        if run_id is None:
            experiment = self.client.get_experiment_by_name(project)
            artifacts = None if uri else (run_dir / "mlartifacts").resolve().as_uri()
            experiment_id = (
                experiment.experiment_id if experiment else self.client.create_experiment(project, artifacts)
            )
            run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
            self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in flat_values(config).items()])
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.id = run_id

    def log(self, step: int, metrics: dict[str, float], images: dict[str, Path]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])
        for k, path in images.items():
            self.client.log_image(self.id, Image.open(path), key=k, step=step)

    def close(self) -> None:
        self.client.set_terminated(self.id)


SINKS = {"tensorboard": TensorBoard, "wandb": WandB, "trackio": Trackio, "swanlab": SwanLab, "mlflow": MLflow}
