"""Every configuration of a run, as typed dataclasses: the one source of truth.

A recipe (`omnialign/recipes/`) is a function returning a full `Config`; the command line
edits it with dotted `key=value` overrides (`trainer.total_steps=40 rollout.n=8`).
`apply_overrides` and `validate` fail before any model loads, naming the key, the value and
the fix. Each field's docstring is its documentation (`omnialign train RECIPE --show`).
"""

import ast
import dataclasses
import difflib
import importlib.util
import inspect
import json
import math
import types
import typing
from dataclasses import dataclass, field
from functools import cache


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank; 0 trains the full network."""
    alpha: float = 0.0
    """LoRA alpha (scale alpha/rank); 0 means alpha = rank."""
    targets: list[str] | None = None
    """Module names that get adapters; None takes the adapter's default list."""
    exclude: list[str] | None = None
    """Module names kept free of adapters (peft `exclude_modules`), e.g. ["visual", "audio_tower"]."""


@dataclass
class ModelConfig:
    arch: str = "glyphs"
    """Adapter, by architecture: one of `omnialign.models.LOADERS`."""
    path: str | None = None
    """Local directory of the pretrained model; None takes the architecture's default (glyphs ships its own)."""
    dtype: str = "float32"
    """Compute dtype of the trained network: float32 or bfloat16."""
    shift: float | None = None
    """Static shift of the sigma schedule; None takes the model's own (glyphs: 1, SD3: 3, Qwen-Image: dynamic)."""
    transformer_only: bool = False
    """Load only the trained network: offline training from stored latents and prompt embeddings needs
    no VAE and no text encoders (diffusion adapters)."""
    text_tokens: int | None = None
    """Text length prompt conditions are padded (and truncated) to; None keeps the pipeline's default
    (Qwen-Image 512, SD3's T5 256). Shorter is cheaper and exact while prompts fit (FLUX's T5 512, at most 512:
    FLUX attends to its padding, so a length is the pipelines' `max_sequence_length`, not a free choice; FLUX.2's
    chat-formatted prompts likewise, 512 by default)."""
    embedded_guidance: float | None = None
    """Guidance-distilled models (FLUX.1-dev, FLUX.1-Kontext, FLUX.2-dev): the guidance value the transformer embeds,
    in place of true CFG (the pipelines' `guidance_scale`), at rollout and in training; None takes the default
    (FLUX.1-dev 3.5, FLUX.1-Kontext 2.5 as its model card, FLUX.2-dev 4.0). True CFG (rollout.guidance) stays off for
    them."""
    source_resize: bool = True
    """Editing models: resize each source image as the pipeline does by default (FLUX.1-Kontext: to its preferred
    resolution of about 1 MP nearest the source's aspect ratio; Qwen-Image-Edit: to about 1024x1024 at the source's
    aspect ratio, sides multiples of 32); false keeps the source's own size, floored to the model's multiple
    (FluxKontextPipeline's `_auto_resize=False`): cheaper with sources stored small."""
    frames: int = 81
    """Video models (Wan, LTX-2): frames per video, the pipeline's `num_frames`; (frames - 1) must be divisible by the
    VAE's temporal factor (4 for the released Wan VAEs, 8 for LTX-2's): 81 is Wan's default, 121 LTX-2's, 5 or 9 keep
    tests cheap."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapter of the trained network (rank 0: full fine-tuning)."""


@dataclass
class DataConfig:
    prompts: str = "digits"
    """Training prompts: a glyphs prompt set name (digits, pairs). Language algorithms: a language set
    (choice, choice_pairs) or a parquet file written by `omnialign prepare` (its train split)."""
    prompts_per_step: int = 8
    """Distinct prompts per step; each is sampled rollout.n times (one group)."""
    val_prompts: str = "digits"
    """Validation prompts (every prompt of the set is used). Language algorithms: as data.prompts (its val split)."""
    pairs: str | None = None
    """Offline Diffusion-DPO: the training pairs, a folder of `omnialign prepare offline-dpo` chunks."""
    val_pairs: str | None = None
    """Offline Diffusion-DPO: held-out pairs for implicit reward accuracy (None: no validation)."""
    val_seeds: int = 8
    """Validation images per prompt, each from a fixed seed."""
    val_limit: int | None = None
    """Language algorithms: most validation items (prompts, or pairs for DPO), split evenly across
    modalities; None uses the whole validation set."""


@dataclass
class RolloutConfig:
    n: int = 8
    """Samples per prompt: the group size of group-relative advantages."""
    steps: int = 10
    """Denoising steps of a rollout."""
    val_steps: int = 10
    """Denoising steps of validation (ODE sampling)."""
    height: int = 32
    """Image height in pixels."""
    width: int = 32
    """Image width in pixels."""
    guidance: float = 1.0
    """Classifier-free guidance scale; 1 disables CFG (no unconditional forward)."""
    guidance_2: float | None = None
    """Wan 2.2 A14B's guidance on the low-noise expert's steps (`transformer_2`, sigma < boundary_ratio), the
    pipeline's `guidance_scale_2` (released: 3 with guidance 4); None: rollout.guidance. Rollout, replay and
    validation all use it; a model with one network refuses it at its first rollout."""
    cfg_rescale: bool = False
    """Rescale the guided velocity to the conditional one's norm (Qwen-Image true CFG)."""
    negative_prompt: str = ""
    """Prompt of the unconditional branch of CFG."""
    kind: str = "sde"
    """Transition inside the SDE window: sde (Flow-GRPO), cps, dance (DanceGRPO)."""
    eta: float = 1.0
    """Noise level of the SDE window steps."""
    shared_init_noise: bool = False
    """Every sample of a prompt's group starts from the same initial noise (DanceGRPO's `init_same_noise`); their SDE
    steps still differ, so the rewards of a group differ by the policy's stochastic steps alone."""
    window_size: int = 4
    """W: SDE steps per sample; only these are stored and trained."""
    window_start: int = 0
    """Lowest step index where a window may start."""
    window_end: int | None = None
    """Window steps lie below this step index; None means rollout.steps."""
    window_schedule: str = "per_sample"
    """Where the window sits: per_sample (own seed, Flow-GRPO), random (one start per step, MixGRPO),
    progressive (one start per step, sliding by one every window_shift_every steps, MixGRPO)."""
    window_shift_every: int = 1
    """Progressive window: training steps between shifts."""
    micro_batch_size: int = 64
    """Samples denoised in one batched forward (a branched rollout: trunks or trees per chunk, and the states of
    one forward)."""
    grad_graph: bool = False
    """Run the rollout's network calls (and a forward-only replay's) with grad enabled, their outputs detached: a
    compiled network (engine.compile) then runs the update's graph instead of its no-grad one, which fuses and
    reduces differently, so the update replays the recorded log-probs bit for bit at full size (compiled FLUX.1
    blocks at 3072 wide: thousands of outputs apart otherwise; docs/engine.md). Each call holds what the update's
    forward saves until it returns (with activation checkpointing, the blocks' inputs). Eager networks gain nothing
    from it, and so do the algorithms that replay no log-prob (nft, awm, dgpo, online_dpo), which sample without it
    whatever it says. FLUX.1 compiled in fp8 on an H200: samples clipped at clip range 1e-5 0.047-0.063 -> 0, warm step
    2.814 -> 2.637 images/GPU/s, the same peak memory (BENCHMARKS.md). Keep rollout.micro_batch_size equal to
    actor.micro_batch_size: Qwen-Image in fp8 on an H100 with the update at 8 beside the rollout at 16 clipped 0-14% of
    its samples, and none with both at 8 (one run; docs/engine.md)."""
    branches: int = 6
    """TempFlow-GRPO: SDE branches drawn from the trunk's state at each branch step, each finished by the ODE
    (the reference's 6)."""
    branch_steps: list[int] | None = None
    """TempFlow-GRPO: the steps whose transition branches; None: every step but the last (the reference)."""
    split_steps: list[int] = field(default_factory=lambda: [0, 3, 6, 9])
    """BranchGRPO: the steps at which every node of a tree splits into rollout.split_factor children (the reference:
    0, 3, 6, 9 of 20 steps); a tree has split_factor ** len(split_steps) leaves."""
    split_factor: int = 2
    """BranchGRPO: the children of a node at each split step, each drawn with its own noise (the reference's 2)."""
    split_noise_scale: float = 1.0
    """BranchGRPO: the noise of a split step's children is drawn this many times wider while their log-prob is
    scored with the transition's own std (the reference: 4.0, wider siblings from a density that does not score
    them); 1 keeps every edge on-policy."""


@dataclass
class GenerationConfig:
    """Sampling of language rollouts (grpo, dapo, gspo, opd); the samples per prompt are rollout.n."""

    max_new_tokens: int = 64
    """Most tokens generated per response (validation too)."""
    temperature: float = 1.0
    """Sampling temperature; training log-probs use the same one."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this total probability; 1 disables it."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 disables it."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a response (kept in it), besides the model's end-of-turn tokens."""
    micro_batch_size: int = 32
    """Sequences generated together (rollout and greedy validation)."""
    decoder: str = "static"
    """static: omnialign's decoder (static KV cache, the decode step replayed as a CUDA graph; rollout/decode.py;
    the omni thinker's prompts first through its own forward, `policy.prefill`); compiled: the same with the decode
    step through `torch.compile` first (1.4x the tokens/s of static for Qwen3-8B on an H200; a GSPO rollout of 64
    samples on Qwen3-8B LoRA 5.0 s against 7.2 s, BENCHMARKS.md; its first generation compiles, 30-80 s for
    Qwen3-8B; both read the whole text stack for the whole generation, gathered where sharded: over one rank only
    the trained weights are, `fsdp.shard`; the omni recipes' setting: GSPO on the 30B-A3B thinker 2.3x the samples/s
    of `generate` on one H100); transformers: `generate`, which gathers one layer at a time (where the whole text
    stack gathered beside the shards does not fit)."""
    merge_lora: bool = True
    """static and compiled decoders: a layer's seven projections run as four GEMMs by copies of their weights, q/k/v
    stacked and gate/up stacked, with any LoRA adapters folded in (W + s·B·A, made once per generation; the trained
    weights are not touched), instead of the modules' seven GEMMs plus each adapter's two small GEMMs at every token
    (6% more decode tokens/s at batch 128 for Qwen3-8B on an H200, BENCHMARKS.md). Costs a copy of the stacked and
    the adapted weights during generation (9 GB for Qwen3-8B's q/k/v and gate/up in bf16); false: the network's own
    modules, adapters applied as in training."""


@dataclass
class RewardConfig:
    weights: dict[str, float] = field(default_factory=lambda: {"glyph_ocr": 1.0})
    """Rewards and weights of the sum: keys of `omnialign.rewards.REWARDS` or reward.remote, or `path/file.py:fn`."""
    optional: list[str] = field(default_factory=list)
    """Rewards whose failure is logged and scores 0; any other reward that fails stops the step with the reason."""
    options: dict[str, dict] = field(default_factory=dict)
    """Keyword options by reward name, e.g. {"ocr_vlm": {"url": "http://H:P/v1", "model": "M"}} (docs/rewards.md)."""
    remote: dict[str, str] = field(default_factory=dict)
    """Rewards served by `omnialign serve-reward`: name -> http://HOST:PORT; token from $OMNIALIGN_REWARD_TOKEN."""
    per_frame: dict[str, str] = field(default_factory=dict)
    """Video models: rewards of reward.weights (or reward.gold) that score images, applied to every frame of each
    video and reduced over the frames: name -> "mean" or "min", e.g. {"ocr": "mean"} (docs/rewards.md)."""
    gold: str | None = None
    """A gold judge scored at validation only, never trained on or selected against (diffusion): a reward
    name (options from reward.options). Logged as val/gold/accuracy (its mean) and val/gold/KEY for each
    number in its per-sample info; what it reads goes into the grid captions. Glyphs: glyph_gold."""


@dataclass
class AlgorithmConfig:
    name: str = "flowgrpo"
    """Objective. Diffusion: flowgrpo, grpo_guard, dppo, nft, awm, dgpo, gardo, tempflow, branchgrpo, online_dpo,
    distill, diffusion_dpo (offline).
    Language: grpo, dapo, gspo, opd, dpo (see docs/algorithms.md)."""
    clip_range: float = 1e-4
    """PPO ratio clip epsilon, lower side (and upper unless clip_high is set); tiny for diffusion log-probs."""
    clip_high: float | None = None
    """Upper PPO clip epsilon ("clip-higher", DAPO 0.28); None uses clip_range."""
    dual_clip: float | None = None
    """Dual clip c (> 1, typically 3): for A < 0 the loss is capped at -A*c; None disables it."""
    adv_clip: float = 5.0
    """Advantages are clipped to [-adv_clip, adv_clip] (also NFT's c). verl does not clip language advantages:
    set 1e9 for its behaviour."""
    kl_coef: float = 0.0
    """Weight of the KL to the reference policy; 0 skips the reference forward. Diffusion: the exact Gaussian KL
    mean((mu - mu_ref)^2) / (2 std^2), std including sqrt(-dt); flow_grpo divides by the squared noise scale
    without dt, so its coefficient ports as kl_coef * |dt| (x0.1 at dt = -0.1)."""
    kl_estimator: str = "k3"
    """Per-token KL estimator of language algorithms: k1 or k3."""
    aggregation: str = "token-mean"
    """Per-token loss reduction: token-mean, seq-mean-token-mean, seq-mean-token-sum."""
    global_std: bool = True
    """Normalise advantages by the whole batch's reward std (True) or each group's (False)."""
    norm_by_std: bool = True
    """Divide advantages by the std at all (False gives Dr.GRPO's A = r - mean)."""
    old_log_probs: str = "auto"
    """Old policy log-probs: 'rollout' reuses the rollout's own (no extra pass); 'recompute' replays the batch
    through the training forward before the update and logs the gap to the rollout's; 'auto': the rollout's where
    they are the training forward's (diffusion, whose sampler computes each transition's log-prob in float32 from
    the network it trains; language models in float32), a recompute for language models in bfloat16, whose decoders
    round differently from the training forward in the layers (0.01-0.02 nats a token at full size, far beyond
    GSPO's sequence clip range: BENCHMARKS.md, "Rollout log-probs")."""
    dppo_tau: float = 1e-5
    """Flow-DPPO trust region: a term moving away from the old policy is dropped once its KL reaches this."""
    nft_beta: float = 0.1
    """DiffusionNFT strength beta."""
    nft_kappa: float = 0.0
    """DiffusionNFT reference-KL weight kappa (recipes 1e-4); 0 skips the reference forward."""
    nft_timesteps: int = 4
    """DiffusionNFT: training timesteps drawn afresh each step from the rollout schedule."""
    awm_timesteps: int = 6
    """AWM: training noise levels per sample and step, one drawn in each of this many equal strata of the
    rollout's schedule (its first, pure-noise step left out)."""
    awm_weighting: str = "ghuber"
    """AWM: how the flow-matching error becomes a log-likelihood surrogate: uniform, t or ghuber (the reference's
    choice; `awm.matching_log_prob`)."""
    awm_power: float = 0.25
    """AWM: the power p of the ghuber weighting."""
    dgpo_timesteps: int = 4
    """DGPO: training noise levels per step, drawn without replacement from the rollout schedule's first
    `dgpo_first_steps` steps, the same for every sample of the step (the reference: 4)."""
    dgpo_first_steps: int = 7
    """DGPO: the training noise levels come from this many of the rollout schedule's noisiest steps, its first
    (the reference's trunc_steps + 1: 7 of 10 for OCR and PickScore, 5 of 10 for GenEval)."""
    branch_depth_pruning: list[int] = field(default_factory=list)
    """BranchGRPO depth pruning: the child depths whose edges are not trained (the edge of step k has depth k + 1;
    the reference prunes a few of the deepest before the last split); the rollout is unchanged."""
    branch_width_pruning: float = 0.0
    """BranchGRPO width pruning: the share (rounded down) of each tree's edges after its last split that is not
    trained, those whose advantages lie in the middle: the top and bottom halves of the rest are kept (the
    reference's mode 2 keeps 0.5, so 0.5 here)."""
    gardo_auxiliary: list[str] = field(default_factory=list)
    """GARDO: the auxiliary rewards whose mean rank in the batch a sample's rank under the trained (proxy) reward is
    compared with, its uncertainty; each a key of reward.weights, usually with weight 0 (scored, not trained on).
    The reference: aesthetic and imagereward beside an OCR or GenEval proxy; glyphs: jpeg_compressibility."""
    gardo_share: float = 0.1
    """GARDO: the share, among the samples of uncertainty >= 0 (about half the batch), of the most uncertain ones
    whose reference KL counts at the first step; it then follows the batch's uncertainty level within
    gardo_share_range (the reference: 0.1)."""
    gardo_share_range: tuple[float, float] = (0.02, 0.2)
    """GARDO: bounds of the adapted share (the reference's; equal bounds fix the share)."""
    gardo_kl_threshold: float = 3e-3
    """GARDO: the reference becomes the current policy after a step whose gated KL (kl_coef's KL, mean over the
    gated samples) exceeded this, or after ref_update_every steps without a refresh. The reference's 3e-4 is in
    flow_grpo's KL units, |dt| times ours (see kl_coef): 3e-3 here at dt = -0.1."""
    old_schedule: str = "delayed_linear"
    """Refresh of the `old` adapter after each update: copy, or delayed_linear EMA."""
    dpo_beta: float = 0.1
    """DPO beta (language default 0.1; Diffusion-DPO recipes 100, paper 2000); DGPO's group-preference beta (the
    reference's beta_dpo: 10 to 100)."""
    dpo_loss: str = "sigmoid"
    """DPO loss: sigmoid, ipo or hinge."""
    label_smoothing: float = 0.0
    """DPO label smoothing (conservative DPO)."""
    dpo_positive: float = 0.0
    """DPO-Positive's lambda (DPOP, Smaug): the preference margin is lowered by lambda times how far the policy scores
    the chosen sample below the reference (Diffusion-DPO: by lambda * max(0, e_w - e_ref,w) / 2), so that the loss
    cannot fall by making the winner less likely too; 0 is plain DPO (the DPOP paper: 5-500 for language models)."""
    dpo_min_gap: float = 0.0
    """Diffusion-DPO: pairs whose reward gap (winner - loser) is below this get no loss (ties once most samples of a
    prompt are right carry no preference, and training on them lets the policy drift). The loss is the mean over
    the kept pairs, and a step that keeps none takes no optimizer step."""
    ref_update_every: int = 0
    """Online DPO: every this many steps the reference becomes the current policy (flow_grpo's `ref_update_step`,
    iterative DPO); 0 keeps the base model as the reference throughout. GARDO: at most this many steps between
    refreshes (its reference's reset_freq + 1: 16)."""
    average_log_prob: bool = False
    """Language DPO: mean instead of sum of response-token log-probs (true reproduces published IPO, which averages)."""
    timestep_mean: float = 0.0
    """Diffusion-DPO: mean m of u = sigmoid(N(m, s^2)), which picks the training sigma at position floor(u*T) of the
    model's T training sigmas (diffusers' `logit_mean`: m > 0 favours low noise)."""
    timestep_std: float = 1.0
    """Diffusion-DPO: std s of the logit-normal position u (diffusers' `logit_std`)."""
    distill_coef: float = 1.0
    """Weight of the on-policy distillation KL (added to the policy-gradient loss unless name=distill/opd)."""
    teacher_path: str | None = None
    """Teacher model folder for distillation (same architecture as the student)."""


@dataclass
class ActorConfig:
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear learning-rate warmup, in optimizer steps."""
    lr_milestones: list[int] = field(default_factory=list)
    """Applied optimizer steps after which the learning rate is multiplied by `lr_gamma` (torch's MultiStepLR).
    Counted in steps, not as a share of `trainer.total_steps`, so that a recipe's first steps train alike in a
    60-step check and in a 300-step run."""
    lr_gamma: float = 0.5
    """Factor applied to the learning rate at each of `lr_milestones`."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    skip_nonfinite: bool = False
    """On a NaN or infinite gradient (a non-finite loss or reward): False stops the run before that update (the
    last checkpoint stays good); True skips the update, counts it (actor/skipped_updates, shouted in the step
    line and the summary) and goes on. A run whose every update was skipped fails at the end either way."""
    micro_batch_size: int = 16
    """Most samples per training forward/backward on one device; lowered to the largest size that divides
    the device's share of the mini-batch, so a recipe runs on any device count that divides its batch."""
    mini_batch_size: int | None = None
    """Samples per optimizer step across all devices (gradient accumulation); None means the whole batch."""
    epochs: int = 1
    """Passes over each rollout batch."""
    shuffle: bool = True
    """Shuffle samples before each pass (seeded by step)."""
    timestep_staging: bool = False
    """Keep the trajectory in host memory and copy each step's inputs to the device just in time."""
    prefetch: bool = True
    """With timestep staging on CUDA: copy step k+1's inputs on a side stream while step k computes."""


@dataclass
class EngineConfig:
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward (less memory, about a third more compute)."""
    checkpoint_every: int = 1
    """With activation_checkpointing: recompute one block in this many, the first of each run of them (1: every
    block; 2: every other, keeping half the blocks' activations for half the recomputation)."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer states in host memory."""
    reshard_after_forward: bool = True
    """Free gathered parameters after each block's forward (less memory, one more all-gather in backward)."""
    compile: bool = False
    """Compile each block's forward with torch.compile (regional: one graph per batch shape and grad mode, reused by
    every block, up to 64 of them (`engine.fsdp.RECOMPILE_LIMIT`); the first steps pay the compile time)."""
    cudnn_attention: bool = True
    """Let PyTorch's attention (SDPA) pick its cuDNN kernel on CUDA in the trained network's blocks (and its frozen
    copies'); false restricts those blocks alone, not the rest of the process (engine/fsdp.py). With it, the blocks'
    attention modules hand the kernel a contiguous output gradient (`engine.fsdp.dense_attention_grads`), without
    which FLUX.1's backward failed in cuDNN (torch 2.11). cuDNN ran FLUX.1's warm step 5-8% faster than the flash
    kernel on an H100 and Qwen-Image's masked attention faster too (BENCHMARKS.md). The FLUX.2 recipes turn it off:
    their parallel blocks concatenate attention and MLP inside the attention module, where the hooks do not reach
    (klein's recipe ran two steps on cuDNN without failing, 3.6% faster, on an H100; FLUX.2-dev is not measured)."""
    fp8: bool = False
    """LoRA runs: store the frozen linear layers of the network's blocks in float8 e4m3 (a scale per output channel)
    and run their matmuls in FP8 (`torch._scaled_mm`, the input scaled per row) in rollout and training alike, so the
    replayed log-probs stay the rollout's (engine/fp8.py). The base model is then trained as rounded to float8, its
    frozen weights take half the memory, and the matmuls run at FP8 speed on GPUs that have it (Hopper, Ada, later).
    With engine.compile, turn rollout.grad_graph on too: compiled FLUX.1 in fp8 then replays exactly (without it 3-4
    of 64 samples clipped at clip range 1e-5; 6% slower warm step on an H200, BENCHMARKS.md)."""
    fp8_backward: bool = False
    """With engine.fp8: the backward's product through each float8 layer in FP8 too (engine/fp8.py): the output's
    gradient scaled per row to float8 e4m3 against the same float8 weight, where it otherwise runs in bf16 through
    the dequantized weight. The forward, so every log-prob, is unchanged; the gradient reaching the adapters is
    rounded as the forward's inputs are (3 mantissa bits, a scale per row)."""
    sequence_parallel: int = 1
    """Split each sample's tokens over groups of this many consecutive processes (Ulysses attention,
    engine/sequence.py; docs/engine.md): for videos whose activations outgrow one device. The processes of a group
    hold the same samples, so data parallelism runs over the groups (data.prompts_per_step is shared by the process
    count / this); FSDP2 still shards over every process. It must divide the process count and the network's
    attention heads, and the network needs diffusers' context-parallel plan (Wan, Qwen-Image, FLUX; not SD3 or
    glyphs). Online diffusion algorithms only."""


@dataclass
class TrainerConfig:
    total_steps: int = 100
    """Training steps (rollout + reward + update each)."""
    val_every: int = 10
    """Validate every this many steps, and always before training and at the end."""
    save_every: int = 50
    """Save a checkpoint every this many steps, and at the end."""
    keep_last: int = 2
    """Checkpoints kept in the run folder (the newest ones); 0 keeps every checkpoint."""
    output_dir: str = "runs"
    """Runs are written to {output_dir}/{name}/."""
    progress: bool = True
    """Show a progress bar per phase."""
    save_val_images: bool = False
    """Diffusion: also save each validation's images, prompts and rewards as samples/step_N.pt (uint8 images)."""
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers that receive metrics.jsonl's scalars, the validation grids and the config (metrics.jsonl
    is always written): any of tensorboard, wandb, trackio, swanlab, mlflow, each offline or local by default
    (docs/tracking.md); all but tensorboard are extras: pip install 'omnialign[wandb]'."""
    project: str = "omnialign"
    """The tracker project (wandb, trackio, swanlab) or experiment (mlflow) the run is filed under, as `name`."""
    deterministic: bool = False
    """Deterministic kernels for the whole run (engine/dist.py `deterministic`; docs/engine.md): the same config and
    seed on the same device and software give the same metrics.jsonl (its timing/* entries aside), bit for bit. An op
    with no deterministic kernel then stops the run naming itself (on CUDA: top-p sampling's cumsum)."""
    ema_decay: float = 0.0
    """0: off. Otherwise validation samples from an exponential moving average of the trained parameters (float32
    copies, checkpointed beside them; `omnialign export` writes it), as flow_grpo evaluates and saves (its runs: 0.9
    every 8 optimizer steps). Updated after every `ema_every`-th training step s (1, 2, ...) toward the parameters by
    1 - min(s / (9 + s), ema_decay)."""
    ema_every: int = 1
    """Training steps between updates of the moving average (`ema_decay`)."""


@dataclass
class Config:
    name: str = "glyphs"
    """Run name: outputs go to {trainer.output_dir}/{name}/."""
    recipe: str = "glyphs"
    """The recipe this config came from (informational)."""
    seed: int = 0
    """Seed of prompts, noise and windows; a step's draws depend only on (seed, step)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model settings."""
    data: DataConfig = field(default_factory=DataConfig)
    """Data settings."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout settings."""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    """Language generation settings."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward settings."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Algorithm settings."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Actor settings."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Engine settings."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Trainer settings."""


class ConfigError(ValueError):
    pass


DIFFUSION_ALGORITHMS = ("flowgrpo", "grpo_guard", "dppo", "nft", "awm", "dgpo", "gardo", "tempflow", "branchgrpo",
                        "online_dpo", "distill", "diffusion_dpo")  # fmt: skip
BRANCHED_ALGORITHMS = ("tempflow", "branchgrpo")
"""Algorithms whose rollout branches (rollout.branching): a sample is a trunk or tree, its images are leaves."""
LANGUAGE_ALGORITHMS = ("grpo", "dapo", "gspo", "opd", "dpo")
ALGORITHMS = DIFFUSION_ALGORITHMS + LANGUAGE_ALGORITHMS
WINDOW_ALGORITHMS = ("flowgrpo", "grpo_guard", "dppo", "gardo", "distill")
LOGGERS = ("tensorboard", "wandb", "trackio", "swanlab", "mlflow")
"""trainer.loggers choices; each is also the name of its Python module and of its package's extra."""
VIDEO_ARCHS = ("wan", "glyphs_video", "ltx2")  # the architectures that read model.frames


def flat_fields(cls: type = Config, prefix: str = "") -> dict[str, typing.Any]:
    """Every leaf field as {dotted key: type}."""
    out = {}
    for name, tp in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(tp):
            out.update(flat_fields(tp, f"{prefix}{name}."))
        else:
            out[prefix + name] = tp
    return out


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, by field name."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    return {
        a.target.id: b.value.value
        for a, b in zip(body, body[1:])
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
    }


def _type_name(tp: typing.Any) -> str:
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")


def _parse(key: str, text: str, tp: typing.Any) -> typing.Any:
    """Convert the text of an override to the field's type, or raise ConfigError naming both."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        (tp,) = [a for a in args if a is not type(None)]
        return _parse(key, text, tp)
    try:
        if tp is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        if tp in (int, float, str):
            return tp(text)
        if origin in (list, tuple, dict):
            value = json.loads(text) if text[:1] in "[{" else text.split(",")
            if origin is dict:
                return {str(k): args[1](v) for k, v in value.items()}
            items = [_parse(key, str(v), args[0]) for v in value]
            if origin is tuple and len(items) != len(args):
                raise ValueError
            return origin(items)
    except (ValueError, TypeError, AttributeError, json.JSONDecodeError):
        pass
    raise ConfigError(f"{key}={text!r}: expected {_type_name(tp)}")


def apply_overrides(config: Config, overrides: list[str]) -> Config:
    """Apply `key.sub=value` strings in order; unknown keys and wrong types raise ConfigError."""
    fields = flat_fields()
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not of the form key=value (for example trainer.total_steps=40)")
        if key not in fields:
            section, _, leaf = key.rpartition(".")
            ratio = {k: difflib.SequenceMatcher(None, leaf, k.rpartition(".")[2]).ratio() for k in fields}
            near = (k for k in fields if ratio[k] >= 0.75)
            close = sorted(near, key=lambda k: (-ratio[k], not k.startswith(section)))[:3]
            if close:
                raise ConfigError(f"unknown config key {key!r}; did you mean {' or '.join(close)}? "
                                  "(`omnialign train RECIPE --show` lists every key with its doc)")  # fmt: skip
            listed = [k for k in fields if k.startswith(section + ".")] if section else []
            valid = "\n  ".join(f"{k}: {_type_name(fields[k])}" for k in listed or fields)
            raise ConfigError(f"unknown config key {key!r}. Valid keys:\n  {valid}")
        *parents, leaf = key.split(".")
        target = config
        for p in parents:
            target = getattr(target, p)
        setattr(target, leaf, _parse(key, text, fields[key]))
    return config


def recomputes_old_log_probs(config: Config) -> bool:
    """Whether the old policy's log-probs come from a replay before the update (algorithm.old_log_probs)."""
    a = config.algorithm
    auto = a.name in LANGUAGE_ALGORITHMS and config.model.dtype == "bfloat16"
    return a.old_log_probs == "recompute" or (a.old_log_probs == "auto" and auto)


def branch_steps(rollout: RolloutConfig) -> list[int]:
    """TempFlow-GRPO's branch steps: rollout.branch_steps, or every step but the last."""
    return list(range(rollout.steps - 1)) if rollout.branch_steps is None else rollout.branch_steps


def leaves_per_sample(rollout: RolloutConfig) -> int:
    """TempFlow-GRPO: the images (and trained rows) of one trunk: rollout.branches at each branch step."""
    return rollout.branches * len(branch_steps(rollout))


def tree_leaves(rollout: RolloutConfig) -> int:
    """BranchGRPO: the images of one tree: rollout.split_factor children at each split step."""
    return rollout.split_factor ** len(rollout.split_steps)


def images_per_sample(config: Config) -> int:
    """The images one sample's rollout decodes: a TempFlow-GRPO trunk's branches, a BranchGRPO tree's leaves, else 1."""
    if config.algorithm.name == "tempflow":
        return leaves_per_sample(config.rollout)
    return tree_leaves(config.rollout) if config.algorithm.name == "branchgrpo" else 1


def tree_widths(rollout: RolloutConfig) -> list[int]:
    """BranchGRPO: the nodes of one tree after each step k (its edges of step k, of child depth k + 1)."""
    return [rollout.split_factor ** sum(s <= k for s in rollout.split_steps) for k in range(rollout.steps)]


def tree_rows(config: Config) -> int:
    """BranchGRPO: the edges of one tree that are trained: every edge but those of the depths in
    algorithm.branch_depth_pruning, less algorithm.branch_width_pruning of those after the last split."""
    r, a = config.rollout, config.algorithm
    widths, last = tree_widths(r), max(r.split_steps, default=r.steps)
    kept = [k for k in range(r.steps) if k + 1 not in a.branch_depth_pruning]
    return sum(widths[k] for k in kept) - int(a.branch_width_pruning * sum(widths[k] for k in kept if k > last))


def training_batch(config: Config) -> tuple[int, int, str]:
    """(rows of one step's training batch across all devices, the multiple a micro-batch must be, their unit)."""
    d = config.data
    if config.algorithm.name in ("online_dpo", "diffusion_dpo"):  # one pair per prompt
        return d.prompts_per_step, 1, "pairs: one per prompt, data.prompts_per_step"
    if config.algorithm.name == "dpo":  # a pair's chosen and rejected rows train together
        return 2 * d.prompts_per_step, 2, "rows: chosen and rejected of data.prompts_per_step pairs"
    if config.algorithm.name == "branchgrpo":  # one row per trained edge of a tree
        per = tree_rows(config)
        return d.prompts_per_step * config.rollout.n * per, 1, f"edges: data.prompts_per_step * rollout.n * {per}"
    if config.algorithm.name in BRANCHED_ALGORITHMS:  # one row per branch transition
        per = leaves_per_sample(config.rollout)
        return (
            d.prompts_per_step * config.rollout.n * per,
            1,
            (f"transitions: data.prompts_per_step * rollout.n * {per} (rollout.branches x branch steps)"),
        )
    return d.prompts_per_step * config.rollout.n, 1, "samples: data.prompts_per_step * rollout.n"


def check_world_size(config: Config, world_size: int) -> None:
    """Whether `world_size` devices can share the step: sequence-parallel groups, whole prompt groups and equal
    mini-batch shares (over the data-parallel groups: `world_size / engine.sequence_parallel` of them)."""
    batch, multiple, unit = training_batch(config)
    mini, n = config.actor.mini_batch_size or batch, config.engine.sequence_parallel
    if world_size % n:
        raise ConfigError(
            f"engine.sequence_parallel={n} must divide the number of processes ({world_size}): start a multiple of "
            f"{n} processes (torchrun --nproc-per-node) or set a divisor of {world_size}"
        )
    groups = world_size // n
    if config.data.prompts_per_step % groups or mini % (groups * multiple):
        shares = f"{world_size} devices" if n == 1 else f"{groups} groups of engine.sequence_parallel={n} devices"
        raise ConfigError(
            f"{shares} cannot share data.prompts_per_step={config.data.prompts_per_step} (prompt groups "
            f"are never split) and a mini-batch of {mini} {unit.split(':')[0]} equally: run on a device count that "
            f"divides both, or change data.prompts_per_step / actor.mini_batch_size"
        )


def validate(config: Config) -> Config:
    """Cross-field checks that would otherwise fail deep inside a run; raises ConfigError."""
    r, a, d = config.rollout, config.actor, config.data
    window_end = r.steps if r.window_end is None else r.window_end
    batch, multiple, unit = training_batch(config)
    checks = [
        (r.n >= 2 or (r.n >= 1 and config.algorithm.name in BRANCHED_ALGORITHMS),
         f"rollout.n={r.n}: group-relative advantages need at least 2 samples per prompt"),
        *_branch_checks(config),
        (0 <= r.window_start < window_end <= r.steps,
         f"rollout.window_start={r.window_start}, window_end={r.window_end}: "
         f"need 0 <= start < end <= rollout.steps={r.steps}"),
        (0 <= r.window_size <= window_end - r.window_start,
         f"rollout.window_size={r.window_size} does not fit in [{r.window_start}, {window_end}); lower it"),
        (r.window_size > 0 or config.algorithm.name not in WINDOW_ALGORITHMS,
         f"algorithm.name={config.algorithm.name} trains on SDE-window transitions: set rollout.window_size >= 1"),
        (r.kind != "cps" or r.window_size == 0 or window_end < r.steps,
         f"rollout.kind=cps has no noise on the last step (sigma'=0): set rollout.window_end <= {r.steps - 1}"),
        (config.algorithm.name != "grpo_guard" or r.kind != "cps",
         "algorithm.name=grpo_guard with rollout.kind=cps: CPS log-probs drop the Gaussian normaliser 1/(2 std^2), "
         "so GRPO-Guard's bias term does not cancel; set rollout.kind=sde (or dance), or use algorithm.name=flowgrpo "
         "with CPS"),
        (r.window_schedule in ("per_sample", "random", "progressive"),
         f"rollout.window_schedule={r.window_schedule!r}: choose per_sample, random or progressive"),
        (config.algorithm.awm_weighting in ("uniform", "t", "ghuber"),
         f"algorithm.awm_weighting={config.algorithm.awm_weighting!r}: choose uniform, t or ghuber"),
        (config.algorithm.name != "awm" or 1 <= config.algorithm.awm_timesteps < r.steps,
         f"algorithm.awm_timesteps={config.algorithm.awm_timesteps}: 1 to rollout.steps - 1 = {r.steps - 1} (one "
         "noise level per stratum of the schedule after its first step)"),
        (config.algorithm.name != "dgpo" or 1 <= config.algorithm.dgpo_timesteps <= config.algorithm.dgpo_first_steps
         <= r.steps,
         f"algorithm.dgpo_timesteps={config.algorithm.dgpo_timesteps}, dgpo_first_steps="
         f"{config.algorithm.dgpo_first_steps}: need 1 <= dgpo_timesteps <= dgpo_first_steps <= rollout.steps="
         f"{r.steps} (the noise levels are drawn without replacement from the schedule's first dgpo_first_steps)"),
        (config.algorithm.name != "dgpo" or config.algorithm.dpo_beta > 0,
         f"algorithm.dpo_beta={config.algorithm.dpo_beta}: DGPO's beta must be > 0 (the reference's: 10 to 100)"),
        (config.algorithm.name != "dgpo" or (config.algorithm.clip_range > 0 and (config.algorithm.clip_high is None
                                                                                 or config.algorithm.clip_high > 0)),
         f"algorithm.clip_range={config.algorithm.clip_range}, clip_high={config.algorithm.clip_high}: DGPO's clip "
         "ranges must be > 0 (at 0 every sample whose ratio moved at all is clipped; the reference's: 1e-3 to 5e-2)"),
        (config.algorithm.name != "nft" or config.model.lora.rank > 0,
         "algorithm.name=nft keeps its old policy in a second LoRA adapter: set model.lora.rank (e.g. 8)"),
        (config.algorithm.name != "distill" or config.algorithm.teacher_path,
         "algorithm.name=distill needs a teacher: set algorithm.teacher_path=DIR"),
        (r.kind in ("sde", "cps", "dance"), f"rollout.kind={r.kind!r}: choose sde, cps or dance"),
        (config.algorithm.name in ALGORITHMS,
         f"algorithm.name={config.algorithm.name!r}: choose one of {', '.join(ALGORITHMS)}"),
        (not r.shared_init_noise or (r.window_size > 0 and config.algorithm.name not in ("tempflow", "branchgrpo")),
         f"rollout.shared_init_noise with rollout.window_size={r.window_size} and algorithm.name="
         f"{config.algorithm.name}: a group sharing its initial noise differs only by SDE steps, so it needs an SDE "
         "window (window_size > 0), and the branched rollouts (tempflow, branchgrpo) share a trunk already; set "
         "rollout.shared_init_noise=false"),
        (config.algorithm.dpo_positive >= 0,
         f"algorithm.dpo_positive={config.algorithm.dpo_positive} must be >= 0 (DPOP's lambda; 0 is plain DPO)"),
        (config.algorithm.ref_update_every == 0 or (config.algorithm.ref_update_every > 0
                                                    and config.algorithm.name in ("online_dpo", "gardo")),
         f"algorithm.ref_update_every={config.algorithm.ref_update_every}: a positive number of steps, for "
         f"algorithm.name=online_dpo or gardo only (not {config.algorithm.name}); 0 keeps the base model as the "
         "reference"),
        *_gardo_checks(config),
        *_group_wise_checks(config),
        (config.algorithm.old_log_probs in ("auto", "rollout", "recompute"),
         f"algorithm.old_log_probs={config.algorithm.old_log_probs!r}: choose auto, rollout or recompute"),
        (config.model.dtype in ("float32", "bfloat16"),
         f"model.dtype={config.model.dtype!r}: choose float32 or bfloat16"),
        (a.micro_batch_size >= multiple,
         f"actor.micro_batch_size={a.micro_batch_size} must be at least {multiple} ({unit})"),
        (a.mini_batch_size is None or (a.mini_batch_size >= 1 and batch % a.mini_batch_size == 0
                                       and a.mini_batch_size % multiple == 0),
         f"actor.mini_batch_size={a.mini_batch_size} must divide the training batch {batch} ({unit})"),
        (config.model.lora.rank >= 0, f"model.lora.rank={config.model.lora.rank} must be >= 0"),
        (not a.lr <= 0, f"actor.lr={a.lr} must be > 0 (AdamW's learning rate; the recipes use 5e-6 to 3e-4)"),
        (not a.max_grad_norm <= 0,  # NaN: the finite check below names it
         f"actor.max_grad_norm={a.max_grad_norm} must be > 0: gradients are clipped to this norm (0 would zero them "
         "and a negative one flip them); a large value such as 1e9 turns clipping off"),
        (config.engine.checkpoint_every >= 1,
         f"engine.checkpoint_every={config.engine.checkpoint_every} must be at least 1 (1: every block recomputes)"),
        (config.engine.sequence_parallel >= 1,
         f"engine.sequence_parallel={config.engine.sequence_parallel} must be at least 1 (1: no split)"),
        (not config.engine.fp8 or (config.model.lora.rank > 0 and config.algorithm.name not in LANGUAGE_ALGORITHMS),
         f"engine.fp8=true rounds the frozen base weights of a diffusion LoRA run to float8; model.lora.rank="
         f"{config.model.lora.rank}, algorithm.name={config.algorithm.name}: set a LoRA rank (full fine-tuning trains "
         "those weights) and a diffusion algorithm, or engine.fp8=false"),
        (config.engine.fp8 or not config.engine.fp8_backward,
         "engine.fp8_backward=true runs the backward of engine.fp8's float8 layers in FP8: set engine.fp8=true too, "
         "or engine.fp8_backward=false"),
        (config.engine.sequence_parallel == 1 or config.algorithm.name not in (*LANGUAGE_ALGORITHMS, "diffusion_dpo"),
         f"engine.sequence_parallel={config.engine.sequence_parallel}: only the online diffusion trainer splits "
         f"sequences, not algorithm.name={config.algorithm.name}; set engine.sequence_parallel=1"),
        (config.engine.sequence_parallel == 1 or config.model.arch != "ltx2",
         f"engine.sequence_parallel={config.engine.sequence_parallel}: diffusers' context-parallel plan of LTX-2's "
         "transformer splits the video and text tokens, not the audio tokens its attentions also read; LTX-2 runs "
         "unsplit: set engine.sequence_parallel=1"),
        (not (a.timestep_staging and config.engine.cpu_offload),
         "actor.timestep_staging=true with engine.cpu_offload=true: staging copies to the device that offload "
         "avoids; turn one off"),
        (config.trainer.val_every > 0 and config.trainer.save_every > 0,
         "trainer.val_every and trainer.save_every must be positive"),
        (config.trainer.keep_last >= 0,
         f"trainer.keep_last={config.trainer.keep_last} must be >= 0 (the newest checkpoints kept; 0 keeps all)"),
        (config.trainer.total_steps >= 1, f"trainer.total_steps={config.trainer.total_steps} must be at least 1"),
        (len(set(config.trainer.loggers)) == len(config.trainer.loggers),
         f"trainer.loggers={config.trainer.loggers} names a tracker twice (every scalar would be logged twice)"),
        (config.reward.gold is None or config.reward.gold not in config.reward.weights,
         f"reward.gold={config.reward.gold!r} is also a trained reward (reward.weights={config.reward.weights}): a "
         "gold judge must be one that no recipe trains on; name another reward or set reward.gold=null"),
        (config.generation.decoder in ("static", "compiled", "transformers"),
         f"generation.decoder={config.generation.decoder!r}: choose static, compiled or transformers"),
        (config.model.frames == ModelConfig.frames or config.model.arch in VIDEO_ARCHS,
         f"model.frames={config.model.frames}: model.arch={config.model.arch} draws images, not videos, and "
         f"ignores it (video architectures: {', '.join(VIDEO_ARCHS)}); leave it out"),
        *[(name in LOGGERS, f"trainer.loggers={config.trainer.loggers}: {name!r} is not one of {', '.join(LOGGERS)}")
          for name in config.trainer.loggers],
        *[(importlib.util.find_spec(name) is not None,
           f"trainer.loggers={config.trainer.loggers}: {name} is not installed; pip install 'omnialign[{name}]' "
           f"(or pip install {name})") for name in config.trainer.loggers if name in LOGGERS],
        (bool(config.name) and "/" not in config.name and "\\" not in config.name and config.name not in (".", ".."),
         f"name={config.name!r} must be a plain folder name (no '/', not '.' or '..'): the run writes only inside "
         f"trainer.output_dir/name; put the parent folder in trainer.output_dir"),
        (d.prompts_per_step >= 1, f"data.prompts_per_step={d.prompts_per_step} must be at least 1"),
        (d.val_seeds >= 1, f"data.val_seeds={d.val_seeds} must be at least 1 (images per validation prompt)"),
        (a.epochs >= 1, f"actor.epochs={a.epochs} must be at least 1 (passes over each rollout batch)"),
        (r.micro_batch_size >= 1, f"rollout.micro_batch_size={r.micro_batch_size} must be at least 1"),
        (r.steps >= 1 and r.val_steps >= 1,
         f"rollout.steps={r.steps} and rollout.val_steps={r.val_steps} must be at least 1"),
        (r.height >= 1 and r.width >= 1, f"rollout.height={r.height}, rollout.width={r.width} must be positive"),
    ]  # fmt: skip
    if config.algorithm.name in LANGUAGE_ALGORITHMS:
        checks += _language_checks(config)
    numbers = {k: v for k, v in flat_values(to_dict(config)).items() if isinstance(v, float)}
    checks += [(math.isfinite(v), f"{k}={v}: must be a finite number") for k, v in numbers.items()]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    return config


def _step_indices(steps: list[int], count: int) -> bool:
    """Whether `steps` is a non-empty list of distinct step indices in [0, count)."""
    return len(steps) >= 1 and len(set(steps)) == len(steps) and all(0 <= k < count for k in steps)


def _branch_checks(config: Config) -> list[tuple[bool, str]]:
    r = config.rollout
    if config.algorithm.name == "branchgrpo":
        return _tree_checks(config)
    if config.algorithm.name != "tempflow":
        return []
    steps = branch_steps(r)
    return [
        (r.branches >= 2,
         f"rollout.branches={r.branches}: TempFlow-GRPO compares the branches of one state, so it needs at least 2 "
         "(the reference: 6)"),
        (_step_indices(steps, r.steps),
         f"rollout.branch_steps={r.branch_steps}: distinct step indices in [0, rollout.steps={r.steps}); null "
         "branches at every step but the last"),
        (r.kind != "cps" or r.steps - 1 not in steps,
         f"rollout.kind=cps has no noise on the last step (sigma'=0): leave step {r.steps - 1} out of "
         "rollout.branch_steps"),
    ]  # fmt: skip


def _tree_checks(config: Config) -> list[tuple[bool, str]]:
    r, a = config.rollout, config.algorithm
    splits, pruned = r.split_steps, a.branch_depth_pruning
    return [
        (r.split_factor >= 2,
         f"rollout.split_factor={r.split_factor}: BranchGRPO compares the children of each split, so it needs at "
         "least 2 (the reference: 2)"),
        (_step_indices(splits, r.steps),
         f"rollout.split_steps={splits}: at least one, distinct step indices in [0, rollout.steps={r.steps}) (the "
         "reference: [0, 3, 6, 9] of 20)"),
        (r.split_noise_scale > 0,
         f"rollout.split_noise_scale={r.split_noise_scale} must be > 0 (1: on-policy; the reference: 4)"),
        (all(1 <= d <= r.steps for d in pruned),
         f"algorithm.branch_depth_pruning={pruned}: child depths in [1, rollout.steps={r.steps}] (the edge of step "
         "k has depth k + 1)"),
        (0 <= a.branch_width_pruning < 1,
         f"algorithm.branch_width_pruning={a.branch_width_pruning}: a share in [0, 1) of the edges after the last "
         "split (the reference's mode 2: 0.5)"),
        (tree_rows(config) >= 1,
         f"algorithm.branch_depth_pruning={pruned}, branch_width_pruning={a.branch_width_pruning} prune every edge "
         "of the tree: train at least one depth"),
        (r.kind != "cps" or (r.steps - 1 not in splits and r.steps in pruned),
         f"rollout.kind=cps has no noise on the last step (sigma'=0): leave step {r.steps - 1} out of "
         f"rollout.split_steps and add depth {r.steps} to algorithm.branch_depth_pruning, or use rollout.kind=dance "
         "(the reference's)"),
    ]  # fmt: skip


def _gardo_checks(config: Config) -> list[tuple[bool, str]]:
    a, weights = config.algorithm, config.reward.weights
    if a.name != "gardo":
        return []
    low, high = a.gardo_share_range
    return [
        (a.kl_coef > 0,
         f"algorithm.kl_coef={a.kl_coef}: GARDO gates and refreshes the reference KL, so it needs one: set it > 0 "
         "(glyphs_gardo: 0.1, as glyphs; the reference keeps its FlowGRPO recipe's)"),
        (a.ref_update_every >= 1,
         f"algorithm.ref_update_every={a.ref_update_every}: GARDO refreshes its reference at most this many steps "
         "apart; set it >= 1 (the reference: 16)"),
        (bool(a.gardo_auxiliary) and set(a.gardo_auxiliary) <= set(weights),
         f"algorithm.gardo_auxiliary={a.gardo_auxiliary}: GARDO's uncertainty needs at least one auxiliary reward, "
         f"each a key of reward.weights={weights}; add it there with weight 0 to score it without training on it "
         '(e.g. reward.weights={"glyph_ocr": 1, "jpeg_compressibility": 0})'),
        (0 < low <= a.gardo_share <= high <= 1,
         f"algorithm.gardo_share={a.gardo_share}, gardo_share_range={a.gardo_share_range}: need 0 < low <= "
         "gardo_share <= high <= 1 (shares of the samples of uncertainty >= 0; the reference: 0.1 within 0.02, 0.2)"),
        (a.gardo_kl_threshold >= 0,
         f"algorithm.gardo_kl_threshold={a.gardo_kl_threshold} must be >= 0 (0 refreshes the reference every step; "
         "the reference's 3e-4 is 3e-3 in our KL units)"),
    ]  # fmt: skip


GROUP_WISE_REWARDS = ("pairwise_vlm",)
"""Built-in rewards that score the samples of a prompt group against each other (metadata["group"])."""


def _group_wise_checks(config: Config) -> list[tuple[bool, str]]:
    per_frame = config.reward.per_frame
    return [
        (name not in GROUP_WISE_REWARDS,
         f"reward.per_frame={per_frame}: {name!r} is group-wise (it compares the samples of a prompt group with each "
         "other), so per frame it would make the frames of one video compete with each other and judge every frame "
         f"of the group against every other; remove {name!r} from reward.per_frame and judge videos with a video "
         "reward such as vlm_video (docs/rewards.md, Video rewards)")
        for name in per_frame
    ]  # fmt: skip


def _language_checks(config: Config) -> list[tuple[bool, str]]:
    g, al, a = config.generation, config.algorithm, config.actor
    return [
        (g.max_new_tokens >= 1, f"generation.max_new_tokens={g.max_new_tokens} must be at least 1"),
        (g.temperature > 0, f"generation.temperature={g.temperature} must be > 0 (validation is greedy anyway)"),
        (0 < g.top_p <= 1, f"generation.top_p={g.top_p} must be in (0, 1]"),
        (g.top_k >= 0, f"generation.top_k={g.top_k} must be >= 0 (0 disables it)"),
        (g.micro_batch_size >= 1, f"generation.micro_batch_size={g.micro_batch_size} must be at least 1"),
        (al.aggregation in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"),
         f"algorithm.aggregation={al.aggregation!r}: choose token-mean, seq-mean-token-mean or seq-mean-token-sum"),
        (al.kl_estimator in ("k1", "k3"), f"algorithm.kl_estimator={al.kl_estimator!r}: choose k1 or k3"),
        (al.dual_clip is None or al.dual_clip > 1, f"algorithm.dual_clip={al.dual_clip} must be > 1 (or None)"),
        (al.name != "opd" or al.teacher_path is not None,
         "algorithm.name=opd needs algorithm.teacher_path: the folder of the teacher model"),
        (al.dpo_loss in ("sigmoid", "ipo", "hinge"),
         f"algorithm.dpo_loss={al.dpo_loss!r}: choose sigmoid, ipo or hinge"),
        (al.dpo_beta > 0, f"algorithm.dpo_beta={al.dpo_beta} must be > 0"),
        (al.name != "dpo" or a.micro_batch_size % 2 == 0,
         f"actor.micro_batch_size={a.micro_batch_size} must be even for dpo: a pair's two rows train together"),
        (config.data.val_limit is None or config.data.val_limit >= 1,
         f"data.val_limit={config.data.val_limit} must be at least 1 (or None for the whole set)"),
    ]  # fmt: skip


def flat_values(data: dict) -> dict[str, typing.Any]:
    """A `to_dict` output as {dotted key of every leaf field: value} (dict-valued fields stay whole)."""
    out = {}
    for key in flat_fields():
        value = data
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        out[key] = value
    return out


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def from_dict(data: dict, cls: type = Config) -> typing.Any:
    """Rebuild a config from `to_dict` output (as read back from config.json)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            value = from_dict(value, tp)
        elif typing.get_origin(tp) is tuple:
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def describe(config: Config) -> str:
    """Every key with its value and docstring, one per line."""
    lines = []

    def walk(obj: typing.Any, prefix: str) -> None:
        docs = field_docs(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                lines.append(f"{prefix}{f.name} = {value!r}    # {docs.get(f.name, '')}")

    walk(config, "")
    return "\n".join(lines)
