# Released-code preset: docs/method.md §2.1, what the authors' public (verl-agent based) code does.
# $ torchrun --standalone --nproc_per_node=8 train.py --preset released
out_dir = "runs/released"
model = "Qwen/Qwen2.5-1.5B-Instruct"
engine = "vllm"
vllm_kv_gb = 2.0               # KV cache per rank: 16 sequences x 2.5k tokens x 28 KB = 1.2 GB needed
games = "official"
prompt = "full"
max_steps = 20                 # ALFWorld max 20 steps per episode
history_length = 2
max_prompt_tokens = 4096       # left truncation
max_new_tokens = 512
reward_scale = 10.0            # reward = 10 * won - 0.1 * invalid steps
invalid_penalty = 0.1
scheduler = "g2"
K = 5
cluster_mode = "balanced"      # balanced sizes over sorted unique expert lengths
lam = 0.3
cap = 0.8                      # caps mu_global and the sampled ratio
mu_update = "deadband"         # gmsv.batch_acc_low/high: the ALFWorld launcher keeps the yaml's 0.4 / 0.6
acc_low = 0.4                  # (the WebShop one sets 0.5 / 0.5: config/released_webshop.py)
acc_high = 0.6
stats_level = "traj"           # A_k, V_k over 0/1 trajectory flags
sigma_mode = "fixed"           # or "dynamic" = max(0.1, V_k)
sigma_fixed = 0.25
prefix_unit = "token"          # floor(r * prefix tokens), out to that step's end, at most min(L, max_steps) - 1
eta = 0.0                      # gmsv.prefix_sft.enable is False in the yaml and the launchers: no aux loss
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
grad_ckpt = True
eval_every = 50
ckpt_every = 50
