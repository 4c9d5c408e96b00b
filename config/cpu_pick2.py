# A CPU regime for the paper's claim (docs/cpu-demo.md, "Toward a regime"): pick-two tasks only (9-15 expert
# steps), groups of 4, 16 tasks per step, lr 1e-4, 150 steps; config/cpu.py's values otherwise. Chosen from
# the base's and plain GRPO's properties alone: base sampled success 5.0 %, GRPO's groups 80 % all-0 over its
# first 10 steps, every sampled task rescued by hints, lengths over three clusters.
# $ python train.py --preset cpu_pick2 --scheduler none       # plain GRPO
# $ python train.py --preset cpu_pick2                        # Agent-G²
# "_" names are not config keys (config.load_preset drops them)
from config import load_preset as _load_preset

locals().update(_load_preset("cpu"))  # a preset runs as plain assignments into this scope: take cpu.py's
out_dir = "runs/cpu_pick2"
task_types = "pick_two_obj_and_place"   # 40 training games, 9-15 expert steps
group_size = 4                 # with 8, base groups are 72 % all-0; with 4, 80 %
batch_tasks = 16               # 64 rollouts per step, as the demo
lr = 1e-4                      # 5e-4 wrecks GRPO on the long task types within two updates
steps = 150
eval_every = 25
eval_games = 0                 # every pick-two game of valid_unseen
train_panel = 40               # every training game, greedy and sampled
ckpt_every = 25
