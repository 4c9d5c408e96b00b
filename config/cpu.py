# CPU demo preset (the default): the committed SFT base model, built-in generated games,
# vLLM-CPU (or HF) rollouts.
# $ python train.py            # same as: python train.py --preset cpu        (~25 min on 2 cores)
# $ python train.py --scheduler none --out_dir runs/cpu_grpo               # plain GRPO, same budget
# Demo levers, all off in the paper presets (docs/cpu-demo.md): constrained decoding to the admissible
# commands, a compact prompt with every past action, a small SFT base checkpoint, the two short task types,
# small |B|, R and step budget. The base checkpoint was made by this repo's SFT mode
# (docs/cpu-demo.md: exact commands).
out_dir = "runs/cpu"
model = "checkpoints/sft_base"
engine = "auto"
vllm_block = 64                # vLLM-CPU's 128-token blocks reuse a turn's cached prompt coarsely: generation
                               # -20 % on cpu_pick2 (docs/benchmarks.md); 32 measured the same
games = "builtin"
task_types = "pick_and_place_simple,look_at_obj_in_light"   # 80 training games: each is seen ~4 times
prompt = "compact"
constrained = True
max_steps = 15
max_prompt_tokens = 768
max_new_tokens = 32
num_workers = 2
scheduler = "g2"
steps = 40
batch_tasks = 8
group_size = 8
lr = 5e-4
beta2 = 0.99
warmup_frac = 0.05
# the trie-restricted policy cannot drift onto tokens the constraint never allows
kl_coef = 0.0
# token-mean weighs long (losing) episodes more: a net push down (docs/update.md)
loss_agg = "episode"
eta = 0.5
micro_batch = 32
eval_every = 20
eval_games = 0                 # all valid_unseen games of the demo's task types (16)
train_panel = 48               # 48 fixed training games, greedy and sampled
ckpt_every = 20
