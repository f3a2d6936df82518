"""Benchmarks: `omnialign bench NAME`. Each prints a table and writes JSON; figures go to BENCHMARKS.md.

    omnialign bench staging --windows 2 10 50 --modes off on prefetch --out staging.json
    omnialign bench recipe --recipe qwen_image_ocr_flowgrpo_lora --prompts 8 --steps 1 --out flowgrpo.json
    omnialign bench recipe --recipe wan21_t2v_1_3b_ocr_flowgrpo_lora --prompts 1 --steps 2 --out wan.json
    omnialign bench recipe --recipe flux_ocr_flowgrpo_lora --prompts 2 --steps 2 --profile runs/profile/flux
    omnialign bench language --recipe qwen3_omni_dpo --steps 3 --seq-len 1024 --out dpo.json
    omnialign bench language --recipe qwen3_omni_dpo --steps 3 --seq-len 1024 --media image --out dpo_image.json
    omnialign bench language --recipe choice_gspo --model-size 4b --steps 2 --out gspo.json
    omnialign bench decode --model-size 8b --prompts 128 --prompt-len 256 --max-new-tokens 128 --out decode.json

One file per bench, each with what it measures in its docstring: `staging.py` (timestep staging of the FlowGRPO
update), `recipe.py` (full training steps of a diffusion recipe, MFU), `language.py` (training steps of a language
recipe), `decode.py` (the decoders side by side); `models.py` holds the full-size random-weight builders and the FLOP
counts; `profile.py` the torch profiler over a recipe's last step (`--profile DIR`). `--tiny` runs any of them on
tiny configs on the CPU.
"""

import json
from pathlib import Path

import torch

from omnialign.bench.decode import bench_decode
from omnialign.bench.language import bench_language
from omnialign.bench.recipe import bench_recipe
from omnialign.bench.staging import bench_staging
from omnialign.engine import dist


def print_table(rows: list[dict]) -> None:
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r[k]) for k in keys))


def main(name: str, args) -> None:
    if name == "staging":
        rows = bench_staging(args.windows, args.modes, args.tiny)
    elif name == "decode":
        # --tiny checks the bench on a CPU in seconds: a small batch, short prompts and answers
        rows = bench_decode(args.prompts or (4 if args.tiny else 128), args.tiny, args.model_size,
                            args.prompt_len or (16 if args.tiny else 256),
                            args.max_new_tokens or (8 if args.tiny else 512),
                            args.bandwidth, args.logit_scale, Path(args.profile) if args.profile else None,
                            args.decoders)  # fmt: skip
    elif name == "language":
        rows = bench_language(args.recipe or "qwen3_omni_dpo", args.prompts, args.steps, args.tiny,
                              Path(args.work), args.set, args.model_size, args.seq_len, args.prompt_len or 256,
                              args.max_new_tokens or 512, args.media, args.towers)  # fmt: skip
    else:
        rows = bench_recipe(args.recipe or "qwen_image_ocr_flowgrpo_lora", args.prompts or 8, args.steps, args.tiny,
                            args.peak, Path(args.work), args.set,
                            {"off": (False,), "both": (False, True)}[args.deterministic],
                            Path(args.profile) if args.profile else None)  # fmt: skip
    if not dist.init().is_main:
        return
    print_table(rows)
    if args.out:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        Path(args.out).write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=2))
