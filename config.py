"""One flat config for train.py, eval.py and tools/bench.py (nanoGPT / CleanRL spirit).

Every flag is a field of `Config` with a one-line help. A preset is a small Python file of
assignments under config/ (cpu is the default; paper = docs/method.md §2 Table 5; released = docs/method.md
§2.1). Command-line flags override the preset:

    python train.py --preset paper --scheduler linear --steps 50
    python train.py --help                      # every flag, one line each

Unknown flags, bad values and unknown presets exit with a one-line error and status 2.
"""
import argparse
import dataclasses
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field

from envs import ENVS, EnvNames, env_class  # the environments' registry: --env's names, checked in validate
from plumbing.plugins import check_plugins, variant, variant_registry  # noqa: F401 (config.variant)
from plumbing.gamegen import default_cache, official_root  # noqa: F401  (official_root: check_data, tests)


HERE = os.path.dirname(os.path.abspath(__file__))
PRESET_DIR = os.path.join(HERE, "config")

# Allowed values of every string flag that selects a branch. An unknown value is an error.
HINT_SOURCES = ["expert", "self", "mixed"]  # or module:Class, a source of your own (config.variant)
CHOICES = {
    "scheduler": None,  # the depth rules' names: scheduler.G2's and variants/rules.py's (rule_help)
    "sampling": ["gaussian", "uniform", "none"],
    "sigma_mode": ["dynamic", "fixed"],
    "mu_update": ["sign", "deadband", "proportional"],
    "stats_level": ["task", "traj"],
    "prefix_unit": ["action", "token"],
    "cluster_mode": ["quantile", "balanced", "random", "online", "webshop_3"],
    "mode": ["grpo", "aux_only", "sft_full", "sft_prefix"],
    "adv_level": ["traj", "step"],
    "adv_mode": ["mean_norm", "mean_std_norm"],
    "loss_agg": ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "episode"],
    "engine": ["auto", "vllm", "hf"],
    "sample_streams": ["engine", "episode"],
    "prompt": ["full", "compact", "rlvmr", "rlvmr_compact"],
    "games": ["builtin", "official"],
    "env": EnvNames(ENVS),  # the registered environments (envs.ENVS); module:Class too (validate)
    "webshop_backend": ["lite", "official"],
    "webshop_split": ["paper", "authors"],
    "webshop_setting": ["authors", "human"],
    "eval_protocol": ["panel", "authors", "both"],
    "aux_agg": ["token-mean", "prefix-mean"],
    "device": ["auto", "cpu", "cuda"],
    "dtype": ["auto", "float32", "bfloat16"],
    "parallel": ["ddp", "fsdp"],
    "lr_schedule": ["cosine", "constant"],
    "old_logprobs": ["auto", "trainer", "engine"],
    "vllm_log": ["quiet", "all"],
}


def F(default, help, bounds=None):
    """A field with its one-line help; a number's with its range too, in interval notation ("[0, 1]",
    "(0, inf)": inf for no bound; (-inf, inf): any finite value), which check_ranges reads."""
    return field(default=default, metadata={"help": help, **({"range": bounds} if bounds else {})})


def parse_range(text):
    """'[0, 1)' -> (0.0, 1.0, True, False): the bounds and whether each is included."""
    lo, hi = (float(x) for x in text[1:-1].split(","))
    return lo, hi, text[0] == "[", text[-1] == "]"


def check_ranges(cfg):
    """Every number against the range declared beside its help: one line naming the flag, its value and the
    range (cross-field rules stay in validate)."""
    for f in dataclasses.fields(Config):
        if "range" in f.metadata:
            v, (lo, hi, lo_in, hi_in) = getattr(cfg, f.name), parse_range(f.metadata["range"])
            if not (lo < v or lo_in and v == lo) or not (v < hi or hi_in and v == hi) or not math.isfinite(v):
                raise ValueError(f"--{f.name} {v:g}: out of range, expected a value in {f.metadata['range']}")


@dataclass
class Config:
    # ---- run ----
    out_dir: str = F("runs/cpu", "run directory: config.json, log.jsonl, checkpoints")
    seed: int = F(0, "global seed (rank r uses seed + r for sampling)", "[0, 2147483647]")
    device: str = F("auto", "auto | cpu | cuda")
    dtype: str = F("auto", "auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16")
    wandb: bool = F(False, "also log to wandb (optional dependency)")
    resume: str = F("", "resume from this checkpoint directory (or 'auto': latest in out_dir)")
    cache_dir: str = F("", "cache for the tiny model and generated games "
                           "(default ~/.cache/agent_g2 or $AGENT_G2_CACHE)")
    # ---- model / engine ----
    model: str = F("tiny", "hub id or local HF path; 'tiny' builds the offline tiny model in cache_dir")
    engine: str = F("auto", "rollout engine: vllm | hf | auto (vllm when it imports)")
    vllm_mem: float = F(0.5, "vLLM gpu_memory_utilization (GPU only): the share of the card it may use",
                        "(0, 1]")
    vllm_kv_gb: float = F(0.0, "vLLM KV cache in GiB (GPU): 0 = computed from the model for the sequences "
                          "a rank plays at once (parallel.kv_cache_gb); > 0: that size; "
                          "< 0: vLLM's own, from vllm_mem", "(-inf, inf)")
    vllm_block: int = F(0, "vLLM's KV-cache block in tokens, a multiple of 32 (vLLM-CPU's attention takes no "
                        "other): a cached prompt prefix is reused by whole blocks (0: vLLM's default, 16 "
                        "on a GPU, 128 on the CPU)", "[0, 4096]")
    vllm_log: str = F("quiet", "quiet: hide vLLM start-up notices that need no action (CPU build: "
                      "tcmalloc, thread binding, Triton; plumbing/vllm_log.py) | all: every vLLM message")
    vllm_sleep: bool = F(False, "put vLLM to sleep during the update to free GPU memory")
    mem_cap_gb: float = F(0.0, "GPU: cap this process's PyTorch allocations at N GiB "
                          "(emulate a smaller card); 0 = off", "[0, inf)")
    grad_ckpt: bool = F(False, "gradient checkpointing in the policy")
    parallel: str = F("ddp", "ddp | fsdp (FSDP2 fully_shard; needed for 7B on 80 GB cards)")
    # ---- environment / prompt ----
    env: str = F("alfworld", "alfworld | webshop (same pool, rollout loop, scheduler and evaluation)")
    games: str = F("builtin", "ALFWorld: builtin (generated offline, shipped) | "
                   "official ($ALFWORLD_DATA/json_2.1.1)")
    webshop_backend: str = F("lite", "WebShop: lite (this repo's offline site, labelled webshop-lite) | "
                             "official ($WEBSHOP_PATH checkout; `python envs.py webshop-doctor`)")
    webshop_products: int = F(1000, "WebShop-lite: products in the generated catalogue", "[1, inf)")
    webshop_seed: int = F(0, "WebShop-lite: catalogue and goal seed (fixed across run seeds)",
                          "[0, 2147483647]")
    webshop_split: str = F("paper", "WebShop goal split: paper (test 0-499, eval 500-1499, train 1500+) | "
                           "authors (released code: train 500+, validate on the first 500 goals, "
                           "duplicates removed)")
    webshop_setting: str = F("authors", "WebShop, official backend: authors (their 1,000-product files, "
                             "synthetic goals) | human (the full catalogue, human goals); "
                             "lite's generated goals are synthetic")
    hint_source: str = F("expert", "where the prefixes come from (rollout.make_hints): "
                         "expert (the expert trajectories) | self (and, for a task without one, "
                         "the shortest win the policy played) | mixed (each task's shortest of the two) "
                         "| module:Class (a source of your own)")
    drop_walkthroughs: float = F(0.0, "treat this fixed, seeded share of the training tasks as having no "
                                 "expert trajectory (an experiment on hint-less tasks; 0 = none)", "[0, 1]")
    expert_data: str = F("", "expert trajectories in the authors' JSON "
                             "({\"trajectories\": [{\"id\", \"actions\", \"think\"}]}): the hints and their "
                             "thinks; a task without an entry keeps its walkthrough (plumbing.expert_data)")
    train_split: str = F("train", "split used for training tasks (WebShop: train = goals 1500+)")
    eval_split: str = F("valid_unseen", "split(s) for hint-free validation, comma-separated "
                        "(one: logged as 'val'; several: each under its own name). "
                        "WebShop: eval = goals 500-1499; test 0-499")
    eval_protocol: str = F("panel", "panel (every game of each split once, greedy + sampled, "
                           "every --eval_every) | authors (their draw: --authors_episodes workers, "
                           "each its own seeded stream of the first split's games, sampled, "
                           "every --authors_every) | both")
    authors_every: int = F(5, "the authors' protocol: every this many steps (their test_freq), "
                           "and before training", "[1, inf)")
    authors_episodes: int = F(128, "the authors' protocol: episodes per evaluation, one per seeded worker "
                              "(their val_data_size)", "[1, inf)")
    eval_temperature: float = F(1.0, "temperature of the sampled evaluations (the authors': 0.4)", "[0, inf)")
    task_types: str = F("", "comma list of ALFWorld task types to keep "
                            "(empty: all six; WebShop uses every category)")
    train_games: int = F(0, "train on a fixed seeded subset of N games of the split (0 = all)", "[0, inf)")
    max_steps: int = F(50, "episode step budget; expert-prefix steps count against it", "[1, inf)")
    history_length: int = F(2, "(observation, action) pairs shown in the prompt", "[0, inf)")
    prompt: str = F("full", "full (<think> + <action>) | compact (action tag only, short obs, past "
                    "actions) | rlvmr (RLVMR's tags and plan carry-over, ALFWorld: variants/formats.py) | "
                    "rlvmr_compact (its short form)")
    max_prompt_tokens: int = F(2048, "prompt budget; a longer prompt drops its oldest history first, "
                               "keeping the task and the current observation", "[1, inf)")
    max_new_tokens: int = F(256, "reply budget per step; a reply that hits it is invalid", "[1, inf)")
    reward_scale: float = F(1.0, "reward = reward_scale * won - invalid_penalty * invalid steps "
                            "(released code: 10; tests flip its sign or zero it)", "(-inf, inf)")
    invalid_penalty: float = F(0.0, "reward penalty per invalid step (released code: 0.1)", "[0, inf)")
    reward: str = F("paper", "the reward of a finished episode: paper (rollout.Reward) or file:Class, a "
                    "rollout.Reward of your own (README \"Hack it\")")
    constrained: bool = F(False, "constrain decoding to the admissible commands (CPU demo lever)")
    parse_lower: bool = F(False, "lower-case a reply before reading its action (the authors' projection)")
    parse_think: bool = F(False, "a reply without <think>...</think>, or with a CJK character, is played "
                          "but counted invalid (penalised; the authors' projection)")
    num_workers: int = F(2, "environment worker processes", "[1, inf)")
    fork_prefix: bool = F(True, "ALFWorld: the R rollouts of a group share one replay of the expert prefix "
                          "(the env worker forks after it) instead of R replays: "
                          "the same episodes, less env time")
    temperature: float = F(1.0, "rollout sampling temperature", "[0, inf)")
    sample_streams: str = F("episode", "episode (a stream per episode and turn, keyed by seed, step, batch "
                            "position, rollout, turn: the same samples however the requests are batched; "
                            "docs/running.md) | engine (every request draws from its engine's one seeded "
                            "stream: samples depend on the batching)")
    overlap: bool = F(False, "each reply to the env workers as the engine finishes it, each next prompt into "
                      "the running engine as its observation comes back (needs --sample_streams episode: "
                      "the same samples as without)")
    # ---- scheduler (docs/method.md §2, §3, §4) ----
    scheduler: str = F("g2", "the depth rule (the list below; module:Class: a rule of your own)")
    task_sampler: str = F("order", "which tasks form a step's batch: order (plumbing.tasks.BatchOrder, a "
                          "seeded pass over the training set) or file:Class, a sampler of your own")
    fixed_ratio: float = F(0.5, "ratio for --scheduler fixed", "[0, 1]")
    step_every: int = F(50, "step decay: one expert action fewer every this many steps", "[1, inf)")
    K: int = F(3, "number of task clusters", "[1, inf)")
    cluster_mode: str = F("quantile", "quantile (paper) | balanced (released) | random | online | "
                          "webshop_3 (the authors' WebShop groups: L <= 4 | 5 | >= 6)")
    recluster_every: int = F(20, "online clusters: re-cluster every this many steps", "[1, inf)")
    mu0: float = F(0.8, "initial mu_global", "[0, 1]")
    Delta: float = F(0.1, "mu_global step size", "[0, 1]")
    alpha: float = F(0.2, "EMA rate of A_k and V_k", "[0, 1]")
    lam: float = F(1.0, "lambda: pull of the cluster accuracy on mu_i (0 = no adaptive centre)", "[0, inf)")
    gamma: float = F(1.0, "sigma_i = max(gamma * V_k, sigma_min)", "[0, inf)")
    sigma_min: float = F(0.1, "floor of sigma_i", "[0, 1]")
    sigma_mode: str = F("dynamic", "dynamic (gamma*V_k) | fixed (sigma_fixed; no adaptive spread)")
    sigma_fixed: float = F(0.25, "sigma when --sigma_mode fixed", "[0, 1]")
    sampling: str = F("gaussian", "gaussian | uniform (variance-matched) | none (sigma = 0, use mu_i)")
    p_target: float = F(0.5, "target success rate", "[0, 1]")
    mu_update: str = F("sign", "sign (paper) | deadband (released) | proportional (beyond the paper)")
    acc_low: float = F(0.4, "deadband: mu_global moves only when acc_B < acc_low ...", "[0, 1]")
    acc_high: float = F(0.6, "... or acc_B > acc_high", "[0, 1]")
    kp: float = F(0.5, "proportional control gain: mu_global += kp * (p_target - acc_B)", "[0, inf)")
    cap: float = F(1.0, "upper cap of mu_global and of the sampled ratio (released: 0.8)", "(0, 1]")
    stats_level: str = F("task", "A_k, V_k over task means p_i (task) or 0/1 trajectory flags (traj)")
    prefix_unit: str = F("action", "ratio applied to the action count or the rendered-prefix token length")
    hybrid_probe: bool = F(False, "one extra probe group for tasks whose last group was all-0 or all-1")
    max_probes: int = F(2, "binary search: at most this many probe groups per task", "[1, inf)")
    enum_grid: float = F(0.0, "enumeration: ratio grid step (0 = every action depth)", "[0, 1]")
    ucb_c: float = F(0.1, "--scheduler g2_ucb: exploration bonus weight on the cluster centre", "[0, inf)")
    mix_gap: float = F(0.15, "--scheduler g2_mix: the components' centres sit mix_gap below / above mu_k",
                       "[0, 1]")
    hint_free_share: float = F(0.5, "--scheduler g2_hint_free: the share of each batch's tasks played "
                                    "from the start (n = 0)", "[0, 1]")
    # ---- optimisation (docs/method.md §2, Table 5) ----
    mode: str = F("grpo", "grpo (L_GRPO + eta L_aux) | aux_only (no L_GRPO) | sft_full | sft_prefix")
    steps: int = F(200, "training steps T", "[1, inf)")
    batch_tasks: int = F(16, "|B|: tasks per step (global, split across ranks), drawn without repeats from a "
                         "pass over the training set: at most its size", "[1, inf)")
    group_size: int = F(8, "R: rollouts per task", "[1, inf)")
    lr: float = F(1e-5, "peak learning rate (cosine schedule)", "(0, 1]")
    warmup_frac: float = F(0.1, "share of steps used for linear warm-up", "[0, 1]")
    lr_schedule: str = F("cosine", "after warm-up: cosine to 0 (paper) | constant")
    beta1: float = F(0.9, "AdamW beta1", "[0, 1)")
    beta2: float = F(0.999, "AdamW beta2", "[0, 1)")
    weight_decay: float = F(0.0, "AdamW weight decay", "[0, 1]")
    grad_clip: float = F(1.0, "gradient-norm clip", "(0, inf)")
    clip_eps: float = F(0.2, "PPO/GRPO ratio clip epsilon", "(0, 1)")
    dual_clip: float = F(0.0, "dual clip c > 1 for negative advantages (verl's clip_ratio_c, 3.0); 0 = off",
                         "[0, inf)")
    old_logprobs: str = F("auto", "pi_old from the trainer (before the batch's first step) | the engine | "
                          "auto (trainer on CUDA, engine on CPU)")
    tis_cap: float = F(0.0, "beyond the paper: truncated importance weight min(pi_old / pi_engine, C) "
                       "on the pg term (needs trainer old log-probs); 0 = off", "[0, inf)")
    kl_coef: float = F(0.01, "beta: k3 KL to the reference model (0 skips the reference)", "[0, inf)")
    eta: float = F(0.5, "weight of the teacher-forced aux loss on the prefix rows (0 = no L_aux)", "[0, inf)")
    aux_agg: str = F("token-mean", "L_aux over the prefix rows: token-mean (every expert token alike) | "
                     "prefix-mean (each row's token mean, weight 1/n in its n-step prefix: "
                     "the authors' prefix SFT)")
    adv_level: str = F("traj", "group-normalise advantages over trajectories (paper) or step rows (released)")
    advantage: str = F("grpo", "advantage estimator: grpo (paper: group-normalised outcomes) | gigpo | "
                       "beacon | rlvmr (variants/advantages.py) | module:Class (an estimator of your own; "
                       "README Hack it)")
    adv_mode: str = F("mean_norm", "gigpo, beacon: mean_norm (subtract the group mean) | mean_std_norm (and "
                      "divide by the group's std); the references' yaml default is mean_norm")
    step_adv_w: float = F(1.0, "gigpo: omega, beacon: lambda, rlvmr: w, the weight of the step (segment, "
                          "tag) advantage", "[0, inf)")
    rlvmr_alpha: float = F(0.0, "rlvmr: 0 = its code's A^traj + w A^MR; a in (0, 1) = its paper's convex "
                           "a A^traj + (1 - a) A^MR (0.5)", "[0, 1)")
    step_gamma: float = F(0.95, "gigpo: the step return's discount; beacon: the decay of a segment's reward "
                          "with the distance to its milestone", "(0, 1]")
    similarity_thresh: float = F(0.0, "gigpo: group anchors whose difflib ratio is >= this (the "
                                 "reference's similarity mode, greedy, order-dependent; it uses 0.95); "
                                 "0 = exact equality", "[0, 1)")
    milestones: str = F("", "beacon, ALFWorld: a milestone file in BEACON's alfworld.json format (ids "
                        "<task_dir>_<trial_dir>); empty: each task's expert actions")
    milestone_thresh: float = F(0.95, "beacon, ALFWorld: the difflib ratio at which an action matches its "
                                "milestone", "(0, 1]")
    loss_agg: str = F("token-mean", "token-mean | seq-mean-token-sum | seq-mean-token-mean | "
                      "episode (grpo.py)")
    micro_batch: int = F(16, "rows per forward/backward micro-batch", "[1, inf)")
    pack_tokens: int = F(512, "rows that share a prompt prefix share one forward sequence of up to this many "
                         "tokens (a turn and the turns before it; 0: one padded sequence a row)", "[0, inf)")
    ppo_mini_batch: int = F(0, "step rows (global) per optimizer step; a batch takes several in order "
                            "(0 = one step)", "[0, inf)")
    entropy_coef: float = F(0.0, "entropy bonus on the policy's tokens (verl's entropy_coeff)", "[0, inf)")
    loss_terms: str = F("", "extra loss terms, comma-separated: variants/losses.py names or module:Class "
                        "(a grpo.Term of your own; README Hack it)")
    max_bad_steps: int = F(3, "stop after this many non-finite losses in a row", "[1, inf)")
    max_update: float = F(1.0, "stop when one step's update ||dtheta||/||theta|| exceeds this: divergence, "
                          "not learning (a fine-tuning step moves the weights by ~1e-3 of their norm; "
                          "docs/update.md)", "(0, inf)")
    # ---- evaluation / logging / checkpoints ----
    eval_every: int = F(50, "hint-free evaluation every this many steps (0: only start and end)", "[0, inf)")
    eval_games: int = F(0, "validation games per evaluation (0 = all, -1 = no evaluation)", "[-1, inf)")
    train_panel: int = F(0, "also evaluate on this many fixed training games (0 = skip)", "[0, inf)")
    ckpt_every: int = F(50, "checkpoint every this many steps (0 = only at the end)", "[0, inf)")
    keep_ckpts: int = F(2, "keep this many newest checkpoints (0: all)", "[0, inf)")
    overwrite: bool = F(False, "out_dir already holds a run: clear its checkpoints, log and summary first")


# ---- the one list of methods: run_all.sh's grid, eval.py's tables, tools/bench.py's simulation, eval.py
# diagnose's replay and config/released.py read it. name -> (run_all.sh --only group, its flags beyond the
# preset). Table sections follow the groups (report.TABLES); WebShop's entries are named ws_*. [beyond]
# entries go in no grid.
METHODS = {
    "g2": ("main", "--scheduler g2"),
    "grpo": ("main", "--scheduler none"),
    "fixed": ("main", "--scheduler fixed --fixed_ratio 0.5"),
    "linear": ("main", "--scheduler linear"),
    "cosine": ("main", "--scheduler cosine"),
    "step": ("main", "--scheduler step"),
    "target_acc": ("main", "--scheduler target_acc"),
    "binary": ("main", "--scheduler binary --max_probes 2"),
    "enum": ("main", "--scheduler enum"),
    # Table 1's hint-free RL rows (docs/method.md §3.1, §5.1): advantage estimators (variants/advantages.py),
    # hint-free, with the references' reward (10 * won, 0.1 off an invalid step's row); GiGPO as its ALFWorld
    # script (mean_std_norm, omega 1, gamma 0.95); BEACON as its ALFWorld script (gamma 0.9, lambda 10,
    # threshold 0.95) and as its README (gamma 0.95, lambda 1); Agent-G² on top of GiGPO (its future work)
    "gigpo": ("main", "--scheduler none --advantage gigpo --adv_mode mean_std_norm --step_adv_w 1 "
                      "--step_gamma 0.95 --reward_scale 10 --invalid_penalty 0.1"),
    "beacon": ("main", "--scheduler none --advantage beacon --adv_mode mean_norm --step_adv_w 10 "
                       "--step_gamma 0.9 --milestone_thresh 0.95 --reward_scale 10 --invalid_penalty 0.1"),
    "beacon_readme": ("main", "--scheduler none --advantage beacon --adv_mode mean_norm --step_adv_w 1 "
                              "--step_gamma 0.95 --milestone_thresh 0.95 --reward_scale 10 "
                              "--invalid_penalty 0.1"),
    "g2_gigpo": ("main", "--scheduler g2 --advantage gigpo --adv_mode mean_std_norm --step_adv_w 1 "
                         "--step_gamma 0.95 --reward_scale 10 --invalid_penalty 0.1"),
    # Table 1's Aux-RL row (docs/method.md §3.2): RLVMR from its cold start (rlvmr_cold: SFT on tagged
    # trajectories), its tag prompt, reward (10 * won, 0.1 off a format-invalid row) and advantage as its RL
    # script (mean_std_norm, w 1); GRPO from the same cold start and prompt (grpo_cold). run_all.sh adds the
    # tagged file, the cold start's budget and its checkpoint
    "rlvmr_cold": ("aux_rl", "--mode sft_full --scheduler none --prompt rlvmr"),
    "rlvmr": ("aux_rl", "--scheduler none --prompt rlvmr --advantage rlvmr --adv_mode mean_std_norm "
                        "--step_adv_w 1 --reward_scale 10 --invalid_penalty 0.1"),
    "grpo_cold": ("aux_rl", "--scheduler none --prompt rlvmr"),
    # the same estimators under their references' own protocols (GPU grid; config/*_ref.py)
    "gigpo_ref": ("reference", "--preset gigpo_ref"),
    "beacon_ref": ("reference", "--preset beacon_ref"),
    "rlvmr_ref": ("reference", "--preset rlvmr_ref"),
    "released": ("released", "--preset released"),  # the authors' launcher (GPU grid)
    # the released code's depth rules on another preset (the CPU grid): the e065918 launchers' values
    "released_rules": ("released", "--lam 0.3 --cap 0.8 --mu_update deadband --acc_low 0.5 --acc_high 0.5 "
                                   "--stats_level traj --sigma_mode dynamic --K 5 --cluster_mode balanced"),
    "g2_7b": ("main", "--scheduler g2 --model Qwen/Qwen2.5-7B-Instruct --parallel fsdp"),
    "grpo_7b": ("main", "--scheduler none --model Qwen/Qwen2.5-7B-Instruct --parallel fsdp"),
    "no_sampling": ("ablations", "--sampling none"),
    "uniform": ("ablations", "--sampling uniform"),
    "no_adapt_centre": ("ablations", "--lam 0"),
    "no_adapt_spread": ("ablations", "--sigma_mode fixed --sigma_fixed 0.25"),
    "no_aux": ("ablations", "--eta 0"),
    "no_grpo": ("ablations", "--mode aux_only"),
    "K1": ("clusters", "--K 1"),
    "K5": ("clusters", "--K 5"),
    "K10": ("clusters", "--K 10"),
    "random": ("clusters", "--cluster_mode random"),
    "sft_full": ("sft", "--mode sft_full"),
    "sft_prefix": ("sft", "--mode sft_prefix"),
    **{f"ws_{n}": ("webshop", f) for n, f in [("g2", "--scheduler g2"), ("grpo", "--scheduler none"),
                                              ("fixed", "--scheduler fixed --fixed_ratio 0.5"),
                                              ("linear", "--scheduler linear"),
                                              ("cosine", "--scheduler cosine"),
                                              ("step", "--scheduler step"),
                                              ("target_acc", "--scheduler target_acc"),
                                              ("binary", "--scheduler binary --max_probes 2"),
                                              ("enum", "--scheduler enum"),
                                              # GiGPO's WebShop script: mean_norm; BEACON's: gamma 0.95,
                                              # lambda 1, 1.0 off an invalid step
                                              ("gigpo", "--scheduler none --advantage gigpo --adv_mode "
                                                        "mean_norm --step_adv_w 1 --step_gamma 0.95 "
                                                        "--reward_scale 10 --invalid_penalty 0.1"),
                                              ("beacon", "--scheduler none --advantage beacon --adv_mode "
                                                         "mean_norm --step_adv_w 1 --step_gamma 0.95 "
                                                         "--reward_scale 10 --invalid_penalty 1.0")]},
    "ws_released": ("released", "--preset released_webshop"),
    # hint sources (the pick-two regime): half the tasks without an expert trajectory, hinted by the policy's
    # own wins or left unhinted
    "self_hints": ("hints", "--drop_walkthroughs 0.5 --hint_source self"),
    "half_hints": ("hints", "--drop_walkthroughs 0.5"),
    # [beyond] rules beyond the paper (python -m tools.bench sched simulates them)
    "online_clusters": ("beyond", "--cluster_mode online"),
    "proportional_mu": ("beyond", "--mu_update proportional"),
    "hybrid_probe": ("beyond", "--hybrid_probe 1"),
    "g2_ucb": ("beyond", "--scheduler g2_ucb"),
    "g2_mix": ("beyond", "--scheduler g2_mix"),
    "hint_free": ("beyond", "--scheduler g2_hint_free"),
}
# the rollout-budget sweep of the paper's Figure 2b (bench sched, eval.py diagnose): probes vs Agent-G²
BUDGET = {"binary M=1": "--scheduler binary --max_probes 1",
          "binary M=2": "--scheduler binary --max_probes 2",
          "binary M=3": "--scheduler binary --max_probes 3",
          "binary M=4": "--scheduler binary --max_probes 4",
          "enum grid 0.5": "--scheduler enum --enum_grid 0.5",
          "enum grid 0.25": "--scheduler enum --enum_grid 0.25",
          "enum every depth": "--scheduler enum",
          "Agent-G2": "",
          "Agent-G2 + hybrid": "--hybrid_probe 1"}


def flag_values(flags):
    """'--lam 0.3 --K 5' -> {"lam": 0.3, "K": 5}: a method's flags as config values
    (a --preset is left out)."""
    args = vars(parser().parse_args(flags.split()))
    return {k: v for k, v in args.items() if v is not None and k != "preset"}


def scheduler_methods():
    """[(name, config overrides)] of the methods that differ only in their depth rule: what `bench sched`
    simulates and eval.py diagnose replays (not the training variants, the 7B rows, WebShop's copies or whole
    presets)."""
    training = {"mode", "eta", "model", "parallel", "hint_source", "drop_walkthroughs", "preset", "advantage",
                "reward_scale", "invalid_penalty", *ADVANTAGE_FLAGS}
    out = []
    for name, (group, flags) in METHODS.items():
        values = flag_values(flags)
        if group in ("main", "ablations", "clusters", "released", "beyond") and not name.startswith("ws_") \
                and "--preset" not in flags and not set(values) & training:
            out.append((name, values))
    return out


def defaults():
    return dataclasses.asdict(Config())


def load_preset(name):
    """Run config/<name>.py and return its assignments (only known keys allowed)."""
    path = os.path.join(PRESET_DIR, name + ".py") if not name.endswith(".py") else name
    if not os.path.exists(path):
        names = sorted(f[:-3] for f in os.listdir(PRESET_DIR) if f.endswith(".py"))
        raise ValueError(f"unknown preset '{name}' (have: {', '.join(names)})")
    scope = {}
    exec(compile(open(path).read(), path, "exec"), {}, scope)
    vals = {k: v for k, v in scope.items() if not k.startswith("_")}
    bad = sorted(set(vals) - set(defaults()))
    if bad:
        raise ValueError(f"preset {path}: unknown keys {bad}")
    return vals


def fail(msg):
    """A newcomer's error: one line on stderr naming the path and the fix, exit code 2, no traceback."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def check_model(model):
    """'tiny', a local model directory (config.json in it), or a hub id (reached later, see model_error)."""
    if model in ("tiny", "scripted") or not model:
        return
    if os.path.isdir(model):
        if not os.path.exists(os.path.join(model, "config.json")):
            fail(f"--model {model}: no config.json in it, not a saved model; give a checkpoint directory "
                 "(runs/.../ckpt_NNNNNN), a Hugging Face model directory, or 'tiny'")
        return
    if model.startswith(("/", ".", "~")) or model.count("/") > 1 or os.path.exists(model):
        fail(f"--model {model}: no checkpoint at {model}; give an existing checkpoint or model directory, "
             "a Hugging Face id such as Qwen/Qwen2.5-1.5B-Instruct, or 'tiny'")


def model_error(model, e):
    fail(f"--model {model}: not a local directory and not loadable from the Hugging Face hub "
         f"({type(e).__name__}); download it where there is internet and pass its directory, or use 'tiny'")


def check_data(cfg):
    """Official ALFWorld games need $ALFWORLD_DATA, and an expert file must parse (and be tagged where
    --prompt rlvmr fits or replays its steps): say so in one line before any heavy work (the file's name,
    and for bad JSON its line and column)."""
    if cfg.env == "alfworld" and cfg.games == "official":
        try:
            official_root()
        except FileNotFoundError as e:
            fail(str(e))
    if cfg.prompt.startswith("rlvmr") and not cfg.expert_data and replays_expert(cfg):
        fail(f"--prompt {cfg.prompt}: the expert steps this run replays or fits need tagged replies: give "
             "--expert_data a tagged-trajectory file (python -m variants.formats standin)")
    if cfg.expert_data:
        from plumbing.expert_data import read_expert_file
        try:
            entries = read_expert_file(cfg.expert_data)
            if cfg.prompt.startswith("rlvmr") and replays_expert(cfg):  # each step's reply in RLVMR's format
                variant("formats", cfg.prompt).check_steps(cfg.expert_data, entries)
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))


def replays_expert(cfg):
    """Whether a run's rows hold expert replies (hints' prefixes, SFT): --prompt rlvmr's need tags."""
    return cfg.mode != "grpo" or cfg.scheduler != "none"


def check_out_dir(cfg, clear=True):
    """A run directory that already holds a run is never overwritten silently."""
    d = cfg.out_dir
    up = os.path.abspath(d)
    while not os.path.exists(up):  # the nearest part of the path that exists must be a folder
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        fail(f"--out_dir {d}: {up} is a file, not a folder; pick another --out_dir")
    if clear:  # a folder that cannot be made fails now, not after the model and engine have loaded
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            fail(f"--out_dir {d}: cannot create it ({e.strerror}); pick a folder you can write")
    if cfg.resume or not os.path.isdir(d):
        return
    old = [x for x in sorted(os.listdir(d)) if x in ("log.jsonl", "summary.json") or x.startswith("ckpt_")]
    if not old:
        return
    resumable = any(os.path.exists(os.path.join(d, x, "COMPLETE")) for x in old if x.startswith("ckpt_"))
    if not cfg.overwrite:  # a run that failed before its first checkpoint has nothing to resume
        fail(f"--out_dir {d} already holds a run ({', '.join(old[:3])}{', ...' if len(old) > 3 else ''}); "
             + ("continue it with --resume auto, " if resumable else "it wrote no checkpoint to resume: ")
             + "pick a new --out_dir, or add --overwrite 1 to clear it first")
    if clear:
        import shutil
        for x in old:
            p = os.path.join(d, x)
            shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.remove(p)


def validate(cfg):
    if nan := [k for k, v in vars(cfg).items() if isinstance(v, float) and v != v]:
        raise ValueError(f"--{nan[0]} nan: expected a number")
    check_ranges(cfg)  # every number against its declared range; the rules across flags follow
    for key, allowed in CHOICES.items():
        if allowed is not None and getattr(cfg, key) not in allowed:
            raise ValueError(f"--{key} {getattr(cfg, key)!r}: expected one of {allowed}")
    if cfg.scheduler not in rule_names() and ":" not in cfg.scheduler:  # module:Class: check_plugins
        raise ValueError(f"unknown scheduler {cfg.scheduler!r}: expected one of {rule_names()} "
                         "or module:Class")
    if cfg.hint_source not in HINT_SOURCES and not re.fullmatch(r"[\w.]+:\w+", cfg.hint_source):
        raise ValueError(f"--hint_source {cfg.hint_source!r}: expected one of {HINT_SOURCES} or module:Class")
    if cfg.group_size < 2 and cfg.mode == "grpo":
        raise ValueError(f"--group_size {cfg.group_size}: GRPO needs at least 2 rollouts per task "
                         "(with one, every group-normalised advantage is 0 and nothing trains)")
    if cfg.tis_cap > 0 and cfg.old_logprobs == "engine":
        raise ValueError("--tis_cap needs the trainer's old log-probs (--old_logprobs trainer or auto)")
    if cfg.dual_clip != 0 and cfg.dual_clip <= 1:
        raise ValueError("--dual_clip must be > 1 (or 0 = off)")
    if cfg.overlap and cfg.sample_streams != "episode":
        raise ValueError("--overlap 1 needs --sample_streams episode (else how the overlap batches the "
                         "requests changes the samples)")
    if cfg.vllm_block % 32:
        raise ValueError("--vllm_block must be 0 (vLLM's default) or a multiple of 32 (the CPU kernel's "
                         "unit)")
    check_plugins(cfg)  # each file:Class importable, with its kind's methods: one line now, before any model
    check_advantage(cfg)
    if cfg.acc_low > cfg.acc_high:
        raise ValueError(f"--acc_low {cfg.acc_low:g} above --acc_high {cfg.acc_high:g}: the deadband is "
                         "[acc_low, acc_high]")
    if cfg.cluster_mode == "webshop_3" and cfg.K != 3:
        raise ValueError(f"--cluster_mode webshop_3 has 3 clusters; got --K {cfg.K}")
    if cfg.env == "webshop" and cfg.webshop_backend == "lite" and cfg.webshop_setting != "authors":
        raise ValueError("--webshop_setting human needs --webshop_backend official "
                         "(lite's goals are synthetic)")
    # the environment: registered or module:Class (one line otherwise), and the splits it has
    known = env_class(cfg.env).split_names(cfg)  # None: only loading can tell (official data not there)
    for flag in ("train_split", "eval_split"):
        names = [x.strip() for x in getattr(cfg, flag).split(",") if x.strip()]
        unknown = [x for x in names if known is not None and x not in known]
        if unknown:
            raise ValueError(f"--{flag} {getattr(cfg, flag)}: no split {unknown[0]!r} in --env {cfg.env} "
                             f"(have: {', '.join(known)})")
    if cfg.expert_data and not os.path.isfile(cfg.expert_data):
        raise ValueError(f"--expert_data {cfg.expert_data}: no such file; give the authors' expert JSON "
                         "(run_all.sh reads data/sft_data/) or leave --expert_data empty")
    return cfg


ADVANTAGES = ["grpo", "gigpo", "beacon", "rlvmr"]  # grpo.GRPO and variants/advantages.py's; or module:Class
ADVANTAGE_FLAGS = ("adv_mode", "step_adv_w", "step_gamma", "similarity_thresh", "milestones",
                   "milestone_thresh", "rlvmr_alpha")  # read by gigpo, beacon and rlvmr only


def check_advantage(cfg):
    """--advantage and its flags: one line for an unknown estimator, a milestone file that is not there or a
    setting that cannot hold (the file's content is checked when the estimator is built, before any model
    loads; the numbers' ranges by check_ranges)."""
    if cfg.advantage not in ADVANTAGES and ":" not in cfg.advantage:  # module:Class: check_plugins
        raise ValueError(f"unknown advantage estimator {cfg.advantage!r}: expected one of {ADVANTAGES} "
                         "or module:Class")
    if cfg.milestones and (cfg.advantage != "beacon" or cfg.env != "alfworld"):
        raise ValueError("--milestones is read by --advantage beacon on --env alfworld only (WebShop's "
                         "milestones come from its phase detector)")
    if cfg.milestones and not os.path.isfile(cfg.milestones):
        raise ValueError(f"--milestones {cfg.milestones}: no such file (BEACON's migpo/alfworld.json "
                         "format); leave it empty to use each task's expert actions")
    if cfg.advantage == "rlvmr" and not cfg.prompt.startswith("rlvmr"):
        raise ValueError(f"--advantage rlvmr rewards RLVMR's tags: it needs --prompt rlvmr or rlvmr_compact "
                         f"(--prompt {cfg.prompt}'s replies carry none" + ("; its constrained decoder emits "
                                                                           "action tags only)"
                                                                           if cfg.constrained else ")"))
    if cfg.prompt.startswith("rlvmr") and cfg.env != "alfworld":
        raise ValueError(f"--prompt {cfg.prompt} is ALFWorld's: RLVMR has no WebShop path (its released code "
                         f"tags ALFWorld and SciWorld replies only); got --env {cfg.env}")
    if cfg.advantage == "beacon" and cfg.scheduler != "none":
        raise ValueError(f"--advantage beacon plays hint-free (--scheduler none): its segments are defined "
                         f"on whole trajectories; got --scheduler {cfg.scheduler}")


def _bool(s):
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {s!r}")


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors (an unknown flag, a bad type or choice) in one line: no usage dump."""

    def error(self, message):
        self.exit(2, f"error: {message} (--help lists every flag)\n")


def parser(description=""):
    p = OneLineParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                      allow_abbrev=False)
    p.add_argument("--preset", default="cpu", help="preset file under config/ (cpu | paper | released | ...)")
    for f in dataclasses.fields(Config):
        kind = {bool: _bool, int: int, float: float, str: str}[type(f.default)]
        choices = CHOICES.get(f.name)
        extra = "; ".join(f"{k}: {h}" for k, h in rule_help().items()) if f.name == "scheduler" else ""
        p.add_argument("--" + f.name, type=kind, default=None, choices=choices,
                       metavar=f.name.upper() if choices is None else None,
                       help=f"{f.metadata['help']} [{f.default}]" + (f" ({extra})" if extra else ""))
    return p


def rule_help():
    """--scheduler's names and one-line helps: g2 (scheduler.G2) and every rule of variants/rules.py."""
    return {name: rule.help for name, rule in variant_registry("rules").items()}


def rule_names():
    return list(rule_help())


def get_config(argv=None, description="", extra=None, base=None):
    """Parse preset + overrides into a validated Config. Errors exit(2) with one line.
    extra(parser) may add a script's own arguments: then (cfg, namespace of those) is returned.
    base: values that replace the preset's (e.g. a checkpoint's training config); flags still win."""
    p = parser(description)
    if extra:
        extra(p)
    args = p.parse_args(argv)
    known = defaults()
    try:
        vals = dict(known)
        vals.update(load_preset(args.preset))
        vals.update({k: v for k, v in (base or {}).items() if k in known})
        vals.update({k: v for k, v in vars(args).items() if k in known and v is not None})
        cfg = validate(Config(**vals))
    except (ValueError, TypeError) as e:
        p.exit(2, f"error: {e}\n")
    cfg.preset = args.preset  # recorded in the dump, not a flag of its own
    if cfg.temperature == 0 and cfg.mode == "grpo":
        print("warning: --temperature 0: a group's greedy rollouts play alike, so their advantages are 0 and "
              "GRPO learns nothing from them", file=sys.stderr)
    if cfg.advantage == "grpo" and (set_ := [f for f in ADVANTAGE_FLAGS if getattr(cfg, f) != defaults()[f]]):
        print(f"warning: --{set_[0]} belongs to --advantage gigpo / beacon; under --advantage grpo it does "
              "nothing", file=sys.stderr)
    for name, rule in variant_registry("rules").items():  # a rule's own flag under another does nothing
        for flag in getattr(rule, "flags", ()):
            if name != cfg.scheduler and getattr(cfg, flag) != defaults()[flag]:
                print(f"warning: --{flag} belongs to --scheduler {name}; "
                      f"under --scheduler {cfg.scheduler} it does nothing", file=sys.stderr)
    if extra:
        return cfg, argparse.Namespace(**{k: v for k, v in vars(args).items()
                                          if k not in known and k != "preset"})
    return cfg


# ---- the one lookup: the core reaches variants/ through here alone, once, at setup
def print_methods():
    """`python config.py methods`: one line per method, name <tab> group <tab> flags
    (run_all.sh reads them)."""
    for name, (group, flags) in METHODS.items():
        print(f"{name}\t{group}\t{flags}")


def git_commit():
    """The checkout's commit (+ '-dirty' with uncommitted changes), or '' outside git."""
    import subprocess
    try:
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                           timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return c + ("-dirty" if c and dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def dump(cfg, path):
    d = dict(dataclasses.asdict(cfg), preset=getattr(cfg, "preset", ""), argv=sys.argv,
             git_commit=git_commit())
    with open(path, "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)


def cache_dir(cfg=None):
    """--cache_dir, else $AGENT_G2_CACHE or ~/.cache/agent_g2 (created)."""
    if cfg is not None and cfg.cache_dir:
        os.makedirs(cfg.cache_dir, exist_ok=True)
        return cfg.cache_dir
    return default_cache()


if __name__ == "__main__":
    if sys.argv[1:] != ["methods"]:
        sys.exit("usage: python config.py methods")
    print_methods()
