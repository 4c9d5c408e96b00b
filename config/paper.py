# Paper preset: docs/method.md §2, Table 5 (shared by ALFWorld and WebShop), Qwen2.5-1.5B-Instruct on 8 GPUs.
# $ torchrun --standalone --nproc_per_node=8 train.py --preset paper
# 7B: add --model Qwen/Qwen2.5-7B-Instruct --parallel fsdp (plain DDP + AdamW does not fit 80 GB).
out_dir = "runs/paper"
model = "Qwen/Qwen2.5-1.5B-Instruct"
engine = "vllm"
games = "official"
prompt = "full"
# the authors' launcher: env.max_steps=20 (the yaml's 50 is overridden); WebShop: 15
max_steps = 20
history_length = 2
# data.max_prompt_length=4096; an over-long prompt drops its oldest history first
max_prompt_tokens = 4096
max_new_tokens = 512
invalid_penalty = 0.0          # the paper's reward is the 0/1 outcome
parse_lower = True             # the authors' action projection: a lower-cased reply, the first <action> tag,
parse_think = True             # and a reply without <think>...</think> counted invalid (still played)
# --env webshop: their 1,000-product files and synthetic goals (env.webshop.use_small, human_goals: False),
# their split (validation: the first 500 distinct goals)
webshop_setting = "authors"
webshop_split = "authors"
scheduler = "g2"
K = 3
cluster_mode = "quantile"
mu0 = 0.8
Delta = 0.1
alpha = 0.2
lam = 1.0
gamma = 1.0
sigma_min = 0.1
sigma_mode = "dynamic"
sampling = "gaussian"
p_target = 0.5
mu_update = "sign"
cap = 1.0
stats_level = "task"
prefix_unit = "action"
eta = 0.5
steps = 200
batch_tasks = 16
group_size = 8
lr = 1e-5
warmup_frac = 0.1
clip_eps = 0.2
kl_coef = 0.01
adv_level = "traj"
micro_batch = 8
pack_tokens = 0                # no packing: a row over 512 tokens (a full prompt) opens a pack of its
                               # own at 512, so no two rows share one: the path packing falls back to
# The paper is silent on these; its code base (verl-agent, as in the released code) sets them:
weight_decay = 0.01            # optim.weight_decay
ppo_mini_batch = 256           # actor.ppo_mini_batch_size: 256 step rows per optimizer step
entropy_coef = 0.001           # actor.entropy_coeff
dual_clip = 3.0                # actor.clip_ratio_c
grad_ckpt = True
# Evaluation: the authors' protocol (their draw of 128 episodes on valid_seen at T = 0.4, every 5 steps and
# before training: trainer.test_freq=5, val_before_train, val_kwargs temperature 0.4) and the full panel of
# both splits, every game once, greedy and at T = 0.4, every 50 steps and at the end
eval_protocol = "both"
eval_split = "valid_seen,valid_unseen"
eval_temperature = 0.4
authors_every = 5
authors_episodes = 128
eval_every = 50
ckpt_every = 50
