# Paper preset: docs/method.md §2, Table 5 (shared by ALFWorld and WebShop), Qwen2.5-1.5B-Instruct on 8 GPUs.
# $ torchrun --standalone --nproc_per_node=8 train.py --preset paper
# 7B: add --model Qwen/Qwen2.5-7B-Instruct --parallel fsdp (plain DDP + AdamW does not fit 80 GB).
out_dir = "runs/paper"
model = "Qwen/Qwen2.5-1.5B-Instruct"
engine = "vllm"
vllm_kv_gb = 2.0               # KV cache per rank: 16 sequences x 2.5k tokens x 28 KB = 1.2 GB needed
games = "official"
prompt = "full"
max_steps = 50
history_length = 2
max_prompt_tokens = 2048
max_new_tokens = 512
invalid_penalty = 0.0
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
# The paper is silent on these; its code base (verl-agent, as in the released code) sets them:
weight_decay = 0.01            # optim.weight_decay
ppo_mini_batch = 256           # actor.ppo_mini_batch_size: 256 step rows per optimizer step
entropy_coef = 0.001           # actor.entropy_coeff
dual_clip = 3.0                # actor.clip_ratio_c
grad_ckpt = True
eval_every = 50
ckpt_every = 50
