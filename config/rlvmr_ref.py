# RLVMR under its own protocol on ALFWorld: Tencent/DigitalHuman RLVMR/code's
# examples/rlvmr_trainer/run_alfworld.sh (read at zzjweb/digitalhuman 789ccd6; docs/method.md §3.2):
# hint-free, from its cold start (run_all.sh passes --model), 30 steps an episode with the full history and
# its tag prompt (meta_think), prompt 6000 / reply 1024 tokens, lr 1e-6, 100 steps of 16 tasks x 8, KL 0.01,
# reward 10 * won and 0.1 off a format-invalid row, mean_std_norm, w 1. Its 87.9 % (1.5B) is on valid_unseen
# (its L1); its script trains at L0 (valid_seen).
# $ torchrun --standalone --nproc_per_node=8 train.py --preset rlvmr_ref \
#       --model runs/paper_grid/rlvmr_cold/s0/ckpt_000063
from config import load_preset as _load_preset

locals().update(_load_preset("paper"))
out_dir = "runs/rlvmr_ref"
scheduler = "none"
prompt = "rlvmr"
advantage = "rlvmr"
adv_mode = "mean_std_norm"
step_adv_w = 1.0
reward_scale = 10.0
invalid_penalty = 0.1
max_steps = 30
history_length = 30            # every earlier step of a 30-step episode (history_length = len(buffer))
max_prompt_tokens = 6000
max_new_tokens = 1024
lr = 1e-6
steps = 100
batch_tasks = 16
group_size = 8
eval_split = "valid_seen,valid_unseen"  # L0 (its script's validation) and L1 (its Table 1's 87.9)
