# GiGPO under its own protocol on ALFWorld: verl-agent's examples/gigpo_trainer/run_alfworld.sh (upstream
# d0b9724; docs/method.md §3.1): hint-free, 50 steps an episode, history 2, prompt 2048 / reply 512 tokens,
# lr 1e-6, 150 steps of 16 tasks x 8, KL 0.01, reward 10 * won and 0.1 off an invalid step's row,
# mean_std_norm, omega 1, gamma 0.95, validation on valid_seen at T = 0.4. Table 1's GiGPO numbers come from
# that protocol; the grid's gigpo row (config.METHODS) runs the paper preset's instead.
# $ torchrun --standalone --nproc_per_node=8 train.py --preset gigpo_ref
from config import load_preset as _load_preset

locals().update(_load_preset("paper"))
out_dir = "runs/gigpo_ref"
scheduler = "none"
advantage = "gigpo"
adv_mode = "mean_std_norm"
step_adv_w = 1.0
step_gamma = 0.95
reward_scale = 10.0
invalid_penalty = 0.1
max_steps = 50
history_length = 2
max_prompt_tokens = 2048
max_new_tokens = 512
lr = 1e-6
steps = 150
batch_tasks = 16
group_size = 8
eval_split = "valid_seen,valid_unseen"  # the script validates on valid_seen (eval_in_distribution)
