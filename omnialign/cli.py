"""The `omnialign` command.

omnialign train                              # the default recipe (glyphs), on a laptop CPU
omnialign train --list                       # the recipes, one line each
omnialign train glyphs trainer.total_steps=40 rollout.n=8 --show
omnialign train glyphs --resume auto         # continue from the newest checkpoint
torchrun --nproc-per-node 4 -m omnialign train RECIPE   # FSDP2 over 4 processes
omnialign export runs/glyphs --to out/          # the newest checkpoint as a PEFT/diffusers adapter or full model
omnialign judge --data DATA --base MODEL --adapter RUN --judge-url URL --out eval/results.jsonl  # docs/judge.md
omnialign eval geneval --data META.jsonl --judge-url URL --out eval/geneval.jsonl  # docs/judge.md
omnialign serve-reward ocr --port 8000       # a reward over HTTP (docs/rewards.md)
omnialign prepare glyphs --out DIR           # retrain the glyphs world (base models, OCR, gold judge)
omnialign prepare choice --out DIR           # retrain the choice-world language model
omnialign prepare avqa ITEMS.json OUT.parquet  # also mmk12, omni-preference (omnialign/data/omni.py)
omnialign prepare ocr INPUT_DIR OUT_DIR      # OCR prompt files (train.txt, test.txt) to parquet (docs/data.md)
omnialign prepare edit EDITS.jsonl OUT.parquet  # instruction + source images to a prompt parquet (docs/data.md)
omnialign prepare offline-dpo PROMPTS OUT_DIR model.arch=sd3 model.path=DIR reward.weights='{"ocr": 1}'
"""

import argparse
import dataclasses
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import TypeVar

T = TypeVar("T")


def summary_line(doc: str, width: int = 140) -> str:
    """A docstring's first sentence on one line, cut at a word with an ellipsis beyond `width` characters."""
    text = " ".join(doc.split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", text)
    text = text[: end.start() + 1] if end else text
    return text if len(text) <= width else text[: text.rfind(" ", 0, width)] + " ..."


def cmd_train(args: argparse.Namespace) -> None:
    from omnialign.config import ConfigError, apply_overrides, describe, validate
    from omnialign.recipes import DEFAULT, RECIPES

    if args.list:
        width = max(map(len, RECIPES))
        for name, fn in RECIPES.items():
            print(f"{name:<{width}}  {summary_line(fn.__doc__ or '')}")
        return
    rest = list(args.args)
    recipe = rest.pop(0) if rest and "=" not in rest[0] else DEFAULT
    if recipe not in RECIPES:
        raise SystemExit(f"unknown recipe {recipe!r}; `omnialign train --list` shows: {', '.join(RECIPES)}")
    try:
        config = validate(apply_overrides(RECIPES[recipe](), rest))
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    if args.show:
        print(describe(config))
        return
    from omnialign.engine.optim import NonFiniteUpdate
    from omnialign.train import main

    try:
        main(config, resume=args.resume)
    except (ConfigError, NonFiniteUpdate, FileNotFoundError) as e:  # the last: a model folder that lacks a part
        raise SystemExit(f"stopped: {e}") from None


def with_options(config: T, args: argparse.Namespace) -> T:
    """`config` (a pretraining dataclass) with each of its fields that the command line gave set."""
    fields = {f.name for f in dataclasses.fields(config)}
    for key, value in vars(args).items():
        if key in fields and value is not None:
            setattr(config, key, value)
    return config


def cmd_prepare(args: argparse.Namespace) -> None:
    from omnialign.worlds.glyphs.pretrain import PretrainConfig, prepare_glyphs

    try:
        prepare_glyphs(with_options(PretrainConfig(), args))
    except (ValueError, OSError) as e:
        raise SystemExit(f"prepare glyphs: {e}") from None


def cmd_prepare_ocr(args: argparse.Namespace) -> None:
    from omnialign.data.ocr import prepare_ocr

    try:
        written = prepare_ocr(args.input_dir, args.out_dir)
    except (ValueError, OSError) as e:
        raise SystemExit(f"prepare ocr: {e}") from None
    for path, rows in written.values():
        print(f"wrote {path} ({rows} prompts)")


def cmd_prepare_edit(args: argparse.Namespace) -> None:
    from omnialign.prepare.edit import parse_size, prepare_edit

    try:
        size = None if args.size is None else parse_size(args.size)
        c = prepare_edit(args.input, args.out, args.store_images, size)
    except (ValueError, OSError) as e:
        raise SystemExit(f"prepare edit: {e}") from None
    stored = f"stored, {c['image_bytes']:,} bytes of PNG" if args.store_images else "referenced"
    print(f"wrote {args.out} ({c['rows']} rows, {c['images']} images {stored}; {c['file_bytes']:,} bytes)")


def cmd_prepare_offline_dpo(args: argparse.Namespace) -> None:
    from omnialign.config import ConfigError, apply_overrides
    from omnialign.prepare.offline_dpo import check_keys, prepare_offline_dpo
    from omnialign.recipes import RECIPES
    from omnialign.rewards import RewardError

    if args.recipe not in RECIPES:
        raise SystemExit(f"prepare offline-dpo: unknown recipe {args.recipe!r}; choose one of {', '.join(RECIPES)}")
    try:
        check_keys(args.overrides)
        config = apply_overrides(RECIPES[args.recipe](), args.overrides)
        counts = prepare_offline_dpo(args.prompts, args.out_dir, config, args.chunk_size, args.store_dtype,
                                     args.serve_reward, not args.no_progress)  # fmt: skip
    except (ConfigError, ValueError, OSError, RewardError) as e:
        raise SystemExit(f"prepare offline-dpo: {e}") from None
    c = counts
    print(f"{args.out_dir}: {c['pairs']} pairs from {c['generated']} prompts in {c['chunks']} new chunks "
          f"({c['done_before']} done before; {c['skipped']} prompts skipped: their candidates tied)")  # fmt: skip


def cmd_prepare_choice(args: argparse.Namespace) -> None:
    from omnialign.worlds.choice.pretrain import ChoicePretrainConfig, prepare_choice

    prepare_choice(with_options(ChoicePretrainConfig(), args))


def cmd_prepare_language(args: argparse.Namespace) -> None:
    from omnialign.data.omni import prepare

    try:
        counts = prepare(args.what, args.source, args.out, args.media_root, args.val_fraction, args.skip_missing)
    except (ValueError, OSError) as e:
        raise SystemExit(f"prepare {args.what}: {e}") from None
    print(f"wrote {args.out}: {counts['train']} train, {counts['val']} val rows ({counts['dropped']} items dropped)")


def cmd_serve_reward(args: argparse.Namespace) -> None:
    import json
    import os
    from pathlib import Path

    from omnialign.rewards import lookup
    from omnialign.rewards.server import RewardServer, serve

    try:
        options = json.loads(args.options)
    except ValueError:
        options = None
    if not isinstance(options, dict):
        raise SystemExit(f"serve-reward: --options={args.options!r} is not a JSON object, e.g. '{{\"psm\": 6}}'")
    try:
        fn = lookup(args.reward, options)
        token = args.token or os.environ.get("OMNIALIGN_REWARD_TOKEN") or None
        if args.token_file:
            token = Path(args.token_file).read_text().strip()
            if not token:
                raise ValueError(f"--token-file {args.token_file} is empty; write the token into it")
        server = RewardServer(fn, args.reward, args.host, args.port, token, args.device, args.max_batch,
                              args.max_queue, reward_timeout=args.reward_timeout, header_timeout=args.header_timeout,
                              body_timeout=args.body_timeout, max_pixels=args.max_pixels)  # fmt: skip
    except (ValueError, OSError) as e:
        raise SystemExit(f"serve-reward: {e}") from None
    serve(server)


def cmd_export(args: argparse.Namespace) -> None:
    from omnialign.export import export

    try:
        out = export(args.checkpoint, args.to)
    except FileNotFoundError as e:
        raise SystemExit(f"export: {e}") from None
    if (out / "adapter_config.json").exists():
        print(f"exported the LoRA adapter to {out}: PeftModel.from_pretrained(network, DIR), or with diffusers "
              "pipeline.load_lora_weights(DIR)")  # fmt: skip
    else:
        print(f"exported the full network to {out}: load it with its class's from_pretrained(DIR)")


def cmd_judge(args: argparse.Namespace) -> None:
    from omnialign.config import ConfigError
    from omnialign.judge import format_summary
    from omnialign.judge import main as judge
    from omnialign.rewards.client import RewardServerError

    try:
        summary = judge(args.data, args.out, args.stage, args.base, args.adapter, args.judge_url, args.judge_model,
                        args.modalities, args.split, args.max_samples, args.seed, args.overrides, args.concurrency,
                        args.judge_media)  # fmt: skip
    except (ConfigError, ValueError, OSError, RewardServerError) as e:
        raise SystemExit(f"judge: {e}") from None
    if summary is not None:
        print(format_summary(summary))


def cmd_eval(args: argparse.Namespace) -> None:
    from omnialign.config import ConfigError
    from omnialign.evaluate import format_summary, main
    from omnialign.rewards.client import RewardServerError

    try:
        summary = main(args.data, args.out, args.base, args.adapter, args.judge_url, args.judge_model, args.seeds,
                       args.seed, args.overrides, args.concurrency, args.max_prompts)  # fmt: skip
    except (ConfigError, ValueError, OSError, RewardServerError) as e:
        raise SystemExit(f"eval {args.benchmark}: {e}") from None
    print(format_summary(summary))


def cmd_bench(args: argparse.Namespace) -> None:
    from omnialign.bench import main

    main(args.name, args)


def installed_version() -> str:
    """The installed distribution's version; a source tree on PYTHONPATH, never installed, has none."""
    try:
        return version("omnialign")
    except PackageNotFoundError:
        return "(a source tree, not installed)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnialign", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--version", action="version", version=f"omnialign {installed_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a recipe", formatter_class=argparse.RawTextHelpFormatter,
                       description="omnialign train [RECIPE] [key=value ...]")  # fmt: skip
    t.add_argument("args", nargs="*", help="recipe name (default glyphs), then dotted key=value overrides")
    t.add_argument("--list", action="store_true", help="list the recipes and exit")
    t.add_argument("--show", action="store_true", help="print the resolved config with each field's doc and exit")
    t.add_argument("--resume", metavar="auto|PATH", help="continue from this run's newest checkpoint (auto), a run "
                   "folder's newest, or a checkpoint folder")  # fmt: skip
    t.set_defaults(fn=cmd_train)
    be = sub.add_parser("bench", help="speed and memory benchmarks: rows printed, and written as JSON with --out "
                        "(BENCHMARKS.md records them)")  # fmt: skip
    be.add_argument("name", choices=["staging", "recipe", "language", "decode"])
    be.add_argument("--recipe", help="recipe: a Qwen-Image(-Edit), FLUX or Wan recipe (default "
                    "qwen_image_ocr_flowgrpo_lora); language: a qwen3/qwen3_omni recipe of dpo, grpo, dapo or gspo "
                    "(default qwen3_omni_dpo)")  # fmt: skip
    be.add_argument("--prompts", type=int, help="recipe, language: prompts (DPO: pairs) per GPU per step "
                    "(default: recipe 8; language the recipe's data.prompts_per_step); decode: the batch "
                    "(128; --tiny 4)")  # fmt: skip
    be.add_argument("--steps", type=int, default=1, help="recipe, language: measured training steps")
    be.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="recipe, language: config overrides")
    be.add_argument("--deterministic", default="off", choices=["off", "both"], help="recipe: both runs the "
                    "steps again under trainer.deterministic's kernels, on the same model (its cost side by "
                    "side)")  # fmt: skip
    be.add_argument("--model-size", default="4b", choices=["0.6b", "1.7b", "4b", "8b", "14b"],
                    help="language (qwen3 recipes), decode: the Qwen3 size (released config, random "
                    "weights)")  # fmt: skip
    be.add_argument("--seq-len", type=int, default=1024, help="language, DPO: tokens per sequence (half prompt)")
    be.add_argument(
        "--media",
        default="text",
        choices=["text", "image", "audio", "video"],
        help="language (qwen3_omni): a random image, audio clip or video first in every prompt",
    )
    be.add_argument("--towers", default="full", choices=["full", "shrunk"],
                    help="language (qwen3_omni): the thinker's vision and audio towers at their released size "
                    "or tiny")  # fmt: skip
    be.add_argument("--prompt-len", type=int, help="language (RL), decode: prompt tokens (256; decode --tiny 16)")
    be.add_argument("--max-new-tokens", type=int, help="language (RL): generation.max_new_tokens; decode: tokens "
                    "sampled (512; decode --tiny 8)")  # fmt: skip
    be.add_argument("--peak", type=float, default=786.0, help="recipe: bf16 matmul peak TFLOP/s for MFU")
    be.add_argument("--bandwidth", type=float, help="decode: memory bandwidth TB/s for the bound (default: the "
                    "card's nominal figure, H100 SXM 3.35, H200 4.8; --tiny: 4.8)")  # fmt: skip
    be.add_argument("--logit-scale", type=float, default=1.0, help="decode: scale the final norm's weight (random "
                    "weights give logits of unit spread, trained models tens) to see the output head's "
                    "rounding")  # fmt: skip
    be.add_argument("--decoders", nargs="+", choices=["transformers", "eager", "graph", "compiled"],
                    help="decode: which decoders, in this order (default: all)")  # fmt: skip
    be.add_argument("--work", default="runs/bench", help="recipe, language: scratch folder")
    be.add_argument("--windows", type=int, nargs="+", default=[2, 10, 50], help="staging: trajectory window sizes")
    be.add_argument("--modes", nargs="+", default=["off", "on", "prefetch"], choices=["off", "on", "prefetch"],
                    help="staging: actor.timestep_staging off, on, and on with prefetch (CUDA)")  # fmt: skip
    be.add_argument("--tiny", action="store_true", help="a tiny config, to check the benchmark itself on a CPU")
    be.add_argument("--profile", metavar="DIR", help="recipe: the last step under the torch profiler; decode: each "
                    "static decoder for 1 and 17 tokens, and one decode step by kernel kind (step.json); traces "
                    "and device time by kernel kind (kernels.json) go to DIR")  # fmt: skip
    be.add_argument("--out", help="write the rows as JSON here")
    be.set_defaults(fn=cmd_bench)
    ex = sub.add_parser("export", help="write a checkpoint as a PEFT/diffusers adapter or a full model")
    ex.add_argument("checkpoint", help="a runs/NAME/checkpoints/step_XXXXXX folder, or runs/NAME (its newest)")
    ex.add_argument("--to", required=True, help="output folder")
    ex.set_defaults(fn=cmd_export)
    pr = sub.add_parser("prepare", help="build data or pretrained assets")
    prep = pr.add_subparsers(dest="what", required=True)
    pr = prep.add_parser(
        "glyphs",
        help="pretrain the glyphs world: gold judge, reward recognizer, base generator",
        description="Defaults and meanings: PretrainConfig, omnialign/worlds/glyphs/pretrain.py",
    )
    pr.add_argument("--out", required=True, help="output folder; omnialign/worlds/glyphs/assets rebuilds the shipped "
                    "world in place. Train on another with model.path=OUT reward.options='{\"glyph_ocr\": {\"path\": "
                    "\"OUT/recognizer\"}, \"glyph_gold\": {\"path\": \"OUT/gold\"}}'")  # fmt: skip
    pr.add_argument("--seed", type=int, help="seed of every draw (images, noise, initial weights; default 0)")
    pr.add_argument("--device", help="cpu, cuda or auto (default: cuda when there is one)")
    for name in ("gold-steps", "recognizer-steps", "clean-steps", "noisy-steps", "eval-every", "fool-rounds",
                 "fool-steps", "refresh-steps", "edit-steps", "video-steps", "video-noisy-steps",
                 "video-batch", "video-patch", "video-eval-seeds"):  # fmt: skip
        pr.add_argument(f"--{name}", type=int)
    for name in ("label-noise", "edit-copy", "edit-lr", "video-noise", "video-lr", "video-stop-gold"):
        pr.add_argument(f"--{name}", type=float)
    pr.add_argument("--gold-init", help="stage gold: fine-tune this gold judge folder instead of training a new one")
    pr.add_argument("--video-init", help="stage video_teacher: continue this video model folder, not from scratch")
    pr.add_argument(
        "--rl-negatives", help="uint8 images (N, 1, 32, 32) a person judged not digits (stage rl_negatives)"
    )
    pr.add_argument("--rl-negative-steps", type=int)
    pr.add_argument("--person-labels", help="RL samples a person labelled by eye (stage person; PretrainConfig)")
    pr.add_argument("--person-steps", type=int)
    pr.add_argument("--noisy-ema", type=float)
    pr.add_argument("--noisy-lr", type=float)
    pr.add_argument("--noisy-batch", type=int)
    pr.add_argument(
        "--stages",
        nargs="+",
        help="stages to run (gold recognizer teacher base fooling rl_negatives person edit video_teacher video; "
        "default all)",
    )
    pr.add_argument("--snapshots", help="also save the EMA generator at every evaluation under this folder")
    pr.add_argument("--fool-recipes", nargs="+", help="recipes whose RL runs look for samples that fool the reward")
    pr.set_defaults(fn=cmd_prepare)
    po = prep.add_parser("ocr", help="OCR prompt files (one prompt per line, target in double quotes) to parquet",
                         description="INPUT_DIR/{train,test}.txt -> OUT_DIR/{train,test}.parquet with columns prompt, "
                         "ground_truth, source, line (docs/data.md)")  # fmt: skip
    po.add_argument("input_dir", help="folder holding train.txt and/or test.txt")
    po.add_argument("out_dir", help="output folder")
    po.set_defaults(fn=cmd_prepare_ocr)
    pd = prep.add_parser("offline-dpo", help="best/worst-of-K preference pairs from a frozen pipeline (docs/data.md)",
                         formatter_class=argparse.RawTextHelpFormatter, description=(
                             "omnialign prepare offline-dpo PROMPTS OUT_DIR [key=value ...]\n"
                             "keys: seed, model.*, reward.*, rollout.n (candidates K), rollout.steps (ODE steps),\n"
                             "rollout.height/width/guidance/cfg_rescale/negative_prompt/micro_batch_size"))  # fmt: skip
    pd.add_argument("prompts", help="prompt file: .txt (one per line), .json, .jsonl or .parquet (a prompt column)")
    pd.add_argument("out_dir", help="output folder: chunk_*.parquet, images/, manifest.json; rerun to resume")
    pd.add_argument("overrides", nargs="*", help="dotted config overrides on the recipe, as for train")
    pd.add_argument("--recipe", default="glyphs", help="the config the overrides edit (default glyphs)")
    pd.add_argument("--chunk-size", type=int, default=64, help="prompts per parquet chunk (the unit of resuming)")
    pd.add_argument("--store-dtype", default="float16", choices=["float16", "float32"],
                    help="dtype of the stored latents and text embeddings")  # fmt: skip
    pd.add_argument("--serve-reward", action="append", default=[], metavar="NAME",
                    help="start `omnialign serve-reward NAME` (with reward.options[NAME]) on loopback and score NAME "
                    "there; NAME must be a key of reward.weights (repeatable)")  # fmt: skip
    pd.add_argument("--no-progress", action="store_true", help="no progress bar")
    pd.set_defaults(fn=cmd_prepare_offline_dpo)
    pe = prep.add_parser("edit", help="an image-editing dataset (instruction, source images) to a prompt parquet",
                         description="INPUT (.jsonl, .json, .csv, .parquet; rows: instruction or prompt, source or "
                         "sources, optional target_text, reference, mask) -> OUT.parquet (docs/data.md)")  # fmt: skip
    pe.add_argument("input", help="the editing dataset; image paths in it are relative to its folder")
    pe.add_argument("out", help="output .parquet (a prompt file for data.prompts)")
    how = pe.add_mutually_exclusive_group()
    how.add_argument("--store-images", dest="store_images", action="store_true", default=True,
                     help="store the images in the parquet as PNG (the default)")  # fmt: skip
    how.add_argument("--reference-images", dest="store_images", action="store_false",
                     help="write the images' paths, relative to OUT's folder, instead")  # fmt: skip
    pe.add_argument("--size", metavar="WxH", help="resize stored images to WxH pixels, e.g. 512x512")
    pe.set_defaults(fn=cmd_prepare_edit)
    pc = prep.add_parser("choice", help="pretrain the choice world's base language model and its noised student")
    pc.add_argument("--out", required=True, help="output folder; omnialign/worlds/choice/assets rebuilds the shipped "
                    "model in place")  # fmt: skip
    pc.add_argument("--seed", type=int)
    pc.add_argument("--steps", type=int, help="optimizer steps in all")
    pc.add_argument("--clean-steps", type=int, help="steps of the unbiased first stage (saved as teacher/)")
    pc.add_argument("--bias", type=float, help='share of the answers to "smallest" questions replaced by A')
    pc.add_argument("--noise", type=float, help="student noise, times each weight matrix's RMS")
    pc.set_defaults(fn=cmd_prepare_choice)
    for kind, what in (("avqa", "audio-visual multiple-choice questions"), ("mmk12", "math questions with images"),
                       ("omni-preference", "multimodal preference pairs")):  # fmt: skip
        pl = prep.add_parser(kind, help=f"{what} (JSON/JSONL) to the language parquet layout (omnialign.data.omni)")
        pl.add_argument("source", help="a JSON list or JSONL file of items")
        pl.add_argument("out", help="output .parquet file")
        pl.add_argument("--media-root", help="folder media paths are relative to (default: the source's folder)")
        pl.add_argument(
            "--val-fraction", type=float, default=0.05, help="share of items without a split that go to val"
        )
        pl.add_argument("--skip-missing", action="store_true", help="drop items whose media files are missing")
        pl.set_defaults(fn=cmd_prepare_language)
    sr = sub.add_parser("serve-reward", help="serve a reward over HTTP (docs/rewards.md)")
    sr.add_argument("reward", help="a key of omnialign.rewards.REWARDS, or path/to/file.py:function")
    sr.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; 0.0.0.0 for all)")
    sr.add_argument("--port", type=int, default=8000, help="port (0 picks a free one; the URL is printed)")
    sr.add_argument("--device", help="move images to this device before scoring, e.g. cuda:1 (default: as sent)")
    tk = sr.add_mutually_exclusive_group()
    tk.add_argument("--token-file", help="require 'Authorization: Bearer TOKEN', TOKEN read from this file "
                    "(default $OMNIALIGN_REWARD_TOKEN if set)")  # fmt: skip
    tk.add_argument("--token", help="as --token-file, the token itself (visible to other users in ps)")
    sr.add_argument("--options", default="{}", help="the reward's keyword options as a JSON object")
    sr.add_argument("--max-batch", type=int, default=64, help="most samples merged into one reward call")
    sr.add_argument("--max-queue", type=int, default=256, help="most requests held before answering 429")
    sr.add_argument("--max-pixels", type=int, default=1 << 28,
                    help="most pixels of one request's images, frames and sources (read from the PNG headers before "
                    "decoding; 413 beyond it): 2^28 by default, 3 GiB as float RGB")  # fmt: skip
    sr.add_argument("--reward-timeout", type=float, default=240.0,
                    help="seconds one reward call may take before its requests get 504")  # fmt: skip
    sr.add_argument("--header-timeout", type=float, default=10.0,
                    help="seconds a connection has to send its request headers; also the keep-alive limit")  # fmt: skip
    sr.add_argument("--body-timeout", type=float, default=60.0,
                    help="seconds a request has to send its body after the headers before 408")  # fmt: skip
    sr.set_defaults(fn=cmd_serve_reward)
    jd = sub.add_parser("judge", help="a judge model compares a trained model with its base (docs/judge.md)",
                        description="omnialign judge --data DATA --base MODEL --adapter PATH --judge-url URL "
                        "--out NAME.jsonl [key=value ...]")  # fmt: skip
    jd.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. generation.max_new_tokens=512 "
                    "model.dtype=bfloat16 rollout.val_steps=28 rollout.height=512 rollout.guidance=4.5")  # fmt: skip
    jd.add_argument("--data", required=True, help="a .parquet file of `omnialign prepare avqa|mmk12|omni-preference` "
                    "or a folder of them; image generators: a prompt set (digits) or prompt file")  # fmt: skip
    jd.add_argument("--out", required=True, help="verdicts NAME.jsonl; the stage files go beside it (docs/judge.md)")
    jd.add_argument("--stage", default="all", choices=["reference", "trained", "judge", "all"])
    jd.add_argument("--base", help="the base model's folder (default: the base of an omnialign checkpoint --adapter)")
    jd.add_argument("--adapter", help="PEFT or full model folder, omnialign checkpoint or run folder, verl "
                    "global_step_N or actor folder")  # fmt: skip
    jd.add_argument("--judge-url", help="OpenAI-compatible API base, e.g. http://127.0.0.1:8001 (/v1 added if no path)")
    jd.add_argument("--judge-model", help="model name sent to the judge (default: the first of its /models)")
    jd.add_argument("--modalities", nargs="+", choices=["text", "image", "audio", "video", "mixed"],
                    help="only items of these modalities (default all)")  # fmt: skip
    jd.add_argument("--max-samples", type=int, help="most items, split evenly across modalities")
    jd.add_argument("--split", default="val", choices=["train", "val"], help="split of the parquet files")
    jd.add_argument("--seed", type=int, default=0, help="seeds the answer order per item (and image noise)")
    media = ["image", "audio", "video"]
    jd.add_argument("--judge-media", nargs="*", default=media, choices=media, help="prompt media sent to the judge")
    jd.add_argument("--concurrency", type=int, default=4, help="judge requests in flight")
    jd.set_defaults(fn=cmd_judge)
    ev = sub.add_parser("eval", help="benchmarks of an image generator, scored behind an endpoint (docs/judge.md)")
    ge = ev.add_subparsers(dest="benchmark", required=True).add_parser(
        "geneval", help="GenEval-style object, count, colour and position accuracy, checked by a VLM",
        description="omnialign eval geneval --data META.jsonl [--base MODEL] [--adapter PATH] --judge-url URL "
        "--out NAME.jsonl [key=value ...]")  # fmt: skip
    ge.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. rollout.val_steps=28 "
                    "rollout.height=512 rollout.guidance=4.5 model.dtype=bfloat16")  # fmt: skip
    ge.add_argument("--data", required=True, help="GenEval metadata: a prompt file whose items carry tag, include "
                    "and exclude (evaluation_metadata.jsonl)")  # fmt: skip
    ge.add_argument("--out", required=True, help="scores NAME.jsonl; images, settings, summary go beside it")
    ge.add_argument("--base", help="the generator's folder (default: the glyphs world's model, or the base of an "
                    "omnialign checkpoint --adapter)")  # fmt: skip
    ge.add_argument("--adapter", help="PEFT or full model folder, omnialign checkpoint or run folder (as for judge)")
    ge.add_argument("--judge-url", help="OpenAI-compatible API base of the VLM, e.g. http://127.0.0.1:8001")
    ge.add_argument("--judge-model", help="model name sent to the VLM (default: the first of its /models)")
    ge.add_argument("--seeds", type=int, default=4, help="images per prompt, each from its own noise (GenEval: 4)")
    ge.add_argument("--seed", type=int, default=0, help="seeds the noise of every image")
    ge.add_argument("--max-prompts", type=int, help="most prompts, split evenly across tags")
    ge.add_argument("--concurrency", type=int, default=4, help="images scored at a time")
    ge.set_defaults(fn=cmd_eval)
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args, extra = p.parse_known_args(argv)
    # overrides may follow the options too (`train glyphs --resume auto trainer.total_steps=400`): argparse leaves
    # the words after an option to the positional list they belong to
    listed = vars(args).get("args" if args.command == "train" else "overrides")
    if extra and (listed is None or any(word.startswith("-") for word in extra)):
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        listed.extend(extra)
    args.fn(args)


if __name__ == "__main__":
    main(sys.argv[1:])
