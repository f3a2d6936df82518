"""Export a training checkpoint for use outside omnialign.

    omnialign export runs/NAME/checkpoints/step_000200 --to exported/   # or runs/NAME: its newest checkpoint

LoRA runs become an adapter folder that both ecosystems load directly:
- `adapter_config.json` + `adapter_model.safetensors` (PEFT layout):
  `PeftModel.from_pretrained(base_network, DIR)`;
- `pytorch_lora_weights.safetensors` (diffusers layout, with the LoRA config in its metadata):
  `pipeline.load_lora_weights(DIR)`, or on the network alone
  `network.load_lora_adapter(DIR, weight_name="pytorch_lora_weights.safetensors", prefix="transformer")`.
Full fine-tuning runs become the network's own `save_pretrained` folder.
"""

import json
import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from omnialign.config import Config, from_dict
from omnialign.engine import checkpoint
from omnialign.models import LOADERS, lora
from omnialign.trainer.ema import ParameterAverage


def run_config(checkpoint_dir: Path) -> Config:
    """The config of the run a checkpoint belongs to (`{run}/config.json`)."""
    path = Path(checkpoint_dir).resolve().parent.parent / "config.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no config.json beside the checkpoints at {path}: is {checkpoint_dir} a step_* folder?"
        )
    return from_dict(json.loads(path.read_text()))


def load_trained_network(checkpoint_dir: Path) -> tuple[Config, torch.nn.Module, "lora.LoraConfig | None"]:
    """The run's network on the host with the checkpoint's trained weights (their moving average where the run kept
    one, `trainer.ema_decay`), and its LoRA config."""
    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / ".metadata").exists():
        raise FileNotFoundError(f"{checkpoint_dir} is not a complete checkpoint (no .metadata)")
    config = run_config(checkpoint_dir)
    config.model.dtype = "float32"
    policy = LOADERS[config.model.arch](config.model)
    net, lora_config = policy.transformer, None
    spec = config.model.lora
    if spec.rank > 0:
        lora_config = lora.apply_lora(net, spec.rank, spec.alpha or spec.rank, spec.targets or policy.lora_targets,
                                      exclude=spec.exclude)  # fmt: skip
    options = StateDictOptions(ignore_frozen_params=True, strict=False)
    state = {"model": get_model_state_dict(net, options=options)}
    dcp.load(state, checkpoint_id=checkpoint_dir, no_dist=True)
    set_model_state_dict(net, state["model"], options=options)
    if config.trainer.ema_decay:  # the run validated the moving average of its trained parameters: take it
        average = ParameterAverage(net, config.trainer.ema_decay, config.trainer.ema_every)
        dcp.load({"tensors": average.tensors()}, checkpoint_id=checkpoint_dir, no_dist=True)
        average.load_into_parameters()
    return config, net, lora_config


def write_adapter(net: torch.nn.Module, lora_config: "lora.LoraConfig", out_dir: Path) -> Path:
    """The `default` adapter of `net` in the PEFT layout and the diffusers layout (see the module doc)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {k: v.contiguous() for k, v in lora.adapter_state_dict(net).items()}
    lora_config.save_pretrained(out_dir)
    save_file({f"base_model.model.{k}": v for k, v in weights.items()}, out_dir / "adapter_model.safetensors")
    meta = {f"transformer.{k}": sorted(v) if isinstance(v, set) else v for k, v in lora_config.to_dict().items()}
    save_file({f"transformer.{k}": v for k, v in weights.items()}, out_dir / "pytorch_lora_weights.safetensors",
              metadata={"format": "pt", "lora_adapter_metadata": json.dumps(meta, sort_keys=True)})  # fmt: skip
    return out_dir


def find_checkpoint(path: Path) -> Path:
    """A complete step_XXXXXX checkpoint folder, or a run folder's newest; FileNotFoundError saying which is
    missing (`--resume PATH` and `export` both take either)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist: give a run folder (runs/NAME) or one of its "
                                "checkpoints/step_XXXXXX folders")  # fmt: skip
    if (path / "checkpoints").is_dir():
        found = checkpoint.latest(path)
        if found is None:
            raise FileNotFoundError(f"{path}: a run folder without a complete checkpoint in checkpoints/ "
                                    "(trainer.save_every sets how often a run writes one)")  # fmt: skip
        return found
    if not (path / ".metadata").exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no .metadata)")
    return path


def export(checkpoint_dir: Path, out_dir: Path) -> Path:
    """Write the adapter (LoRA runs) or the full network (full fine-tuning) of a checkpoint (or a run folder's
    newest) to out_dir. The files are written to a hidden folder beside it and renamed when complete: an interrupted
    export leaves no folder that looks like an adapter without its weights (an existing out_dir is replaced only
    then)."""
    out_dir = Path(out_dir)
    checkpoint_dir = find_checkpoint(checkpoint_dir)
    _, net, lora_config = load_trained_network(checkpoint_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if lora_config is None:
        net.save_pretrained(tmp)
    else:
        write_adapter(net, lora_config, tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir
