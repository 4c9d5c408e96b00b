# Released-code preset for WebShop: config/released.py's values, overridden where the authors' WebShop
# launcher differs from their ALFWorld one
# [ZJU-REAL/Agent-G2 examples/gmsv_trainer/run_webshop.sh vs run_alfworld.sh].
# $ torchrun --standalone --nproc_per_node=8 train.py --preset released_webshop
# "_" names are not config keys (config.load_preset drops them)
from config import load_preset as _load_preset

# a preset runs as plain assignments into this scope: take released.py's
locals().update(_load_preset("released"))
out_dir = "runs/released_webshop"
env = "webshop"
webshop_backend = "official"
max_steps = 15                 # env.max_steps=15
steps = 150                    # trainer.total_epochs=150, one batch of 16 tasks per epoch
ppo_mini_batch = 64            # actor.ppo_mini_batch_size=64
eval_split = "eval"            # the authors' WebShop split: validation on the first 500 distinct goals
# gmsv.num_difficulty_groups=3 with difficulty_group_mode=webshop_3, whose thresholds are fixed:
# length <= 4 | 5 | >= 6 [gmsv/webshop.py, _compute_webshop_three_group_thresholds]
K = 3
cluster_mode = "webshop_3"
