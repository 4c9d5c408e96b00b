# Released-code preset: docs/method.md §2.1, what the authors' public (verl-agent based) code does.
# $ torchrun --standalone --nproc_per_node=8 train.py --preset released
out_dir = "runs/released"
model = "Qwen/Qwen2.5-1.5B-Instruct"
engine = "vllm"
games = "official"
prompt = "full"
max_steps = 20                 # env.max_steps=20 in the launcher (the yaml's 50 is overridden)
history_length = 2
# data.max_prompt_length=4096; an over-long prompt drops its oldest history first
max_prompt_tokens = 4096
max_new_tokens = 512
reward_scale = 10.0            # reward = 10 * won - 0.1 * invalid steps
invalid_penalty = 0.1
# the authors' action projection: a lower-cased reply, the first <action> tag, and a reply without
# <think>...</think> counted invalid (still played, penalised)
parse_lower = True
parse_think = True
webshop_setting = "authors"    # --env webshop: env.webshop.use_small, human_goals: False
webshop_split = "authors"
scheduler = "g2"
# The released code's depth rules: config.METHODS["released_rules"], the one list the CPU grid
# and tools/bench.py read too.
# The launcher that matches the paper's method (examples/gmsv_trainer/run_alfworld.sh at commit e065918) adds
# dynamic sigma, the band 0.5 / 0.5 and prefix SFT at 0.5 to the yaml; the other stored launcher (1df588)
# does not: --sigma_mode fixed --acc_low 0.4 --acc_high 0.6 --eta 0 gives that one (docs/gpu.md).
# Each value and its source:
#   K 5, cluster_mode balanced   gmsv.num_difficulty_groups: 5, balanced sizes over the sorted unique lengths
#   lam 0.3, cap 0.8             gmsv.lambda_value, max_length / mu_global_max:
#                                caps mu_global and the sampled ratio
#   mu_update deadband 0.5 / 0.5 gmsv.batch_acc_low=0.5, batch_acc_high=0.5:
#                                mu_global moves unless acc_B is 0.5
#   stats_level traj             A_k, V_k over 0/1 trajectory flags (gmsv/alfworld.py)
#   sigma_mode dynamic           gmsv.sigma_mode=dynamic_sigma: max(sigma_min 0.1, gamma 1.0 * V_k)
from config import METHODS as _METHODS, flag_values as _flag_values  # "_" names are not config keys

locals().update(_flag_values(_METHODS["released_rules"][1]))
sigma_fixed = 0.25             # the yaml's fixed_sigma, used with --sigma_mode fixed
# floor(r * prefix tokens), out to that step's end, at most min(L, max_steps) - 1
prefix_unit = "token"
eta = 0.5                      # gmsv.prefix_sft.enable=true, loss_coef=0.5
# their prefix SFT: each row's token mean, weight 1/len(prefix) (one copy per rollout)
aux_agg = "prefix-mean"
steps = 300
batch_tasks = 16
group_size = 8
lr = 1e-6
lr_schedule = "constant"       # optim.warmup_style constant, lr_warmup_steps_ratio 0 (ppo_trainer.yaml)
warmup_frac = 0.0
weight_decay = 0.01            # optim.weight_decay (ppo_trainer.yaml)
ppo_mini_batch = 256           # actor.ppo_mini_batch_size x rollout.n (1): 256 step rows per optimizer step
entropy_coef = 0.001           # actor.entropy_coeff
dual_clip = 3.0                # actor.clip_ratio_c: verl's policy loss always applies the dual clip
kl_coef = 0.01
adv_level = "step"
micro_batch = 8
pack_tokens = 0                # no packing: a row over 512 tokens (a full prompt) opens a pack of its
                               # own at 512, so no two rows share one: the path packing falls back to
grad_ckpt = True
# Evaluation as config/paper.py: the authors' draw every 5 steps and the full panel of both splits every 50
eval_protocol = "both"
eval_split = "valid_seen,valid_unseen"
eval_temperature = 0.4
authors_every = 5
authors_episodes = 128
eval_every = 50
ckpt_every = 50
