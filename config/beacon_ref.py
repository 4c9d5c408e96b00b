# BEACON under its own protocol on ALFWorld: ZJU-REAL/BEACON's examples/migpo_trainer/run_alfworld.sh
# (db9347f; docs/method.md §3.1): hint-free, 30 steps an episode with the full history, prompt 7000 tokens,
# lr 1e-6, 200 steps of 16 tasks x 8, KL 0.01, reward 10 * won and 0.1 off an invalid step, mean_norm,
# lambda 10, gamma 0.9, milestone threshold 0.95. Its milestones: --milestones FILE (its migpo/alfworld.json),
# else each task's expert actions. Its README's values instead: add --step_gamma 0.95 --step_adv_w 1.
# $ torchrun --standalone --nproc_per_node=8 train.py --preset beacon_ref \
#       --milestones data/beacon/alfworld.json
from config import load_preset as _load_preset

locals().update(_load_preset("paper"))
out_dir = "runs/beacon_ref"
scheduler = "none"
advantage = "beacon"
adv_mode = "mean_norm"
step_adv_w = 10.0
step_gamma = 0.9
milestone_thresh = 0.95
reward_scale = 10.0
invalid_penalty = 0.1
max_steps = 30
history_length = 30            # history_length=999999 in the script: every earlier step of a 30-step episode
max_prompt_tokens = 7000
max_new_tokens = 512
lr = 1e-6
steps = 200
batch_tasks = 16
group_size = 8
