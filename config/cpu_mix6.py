# The mixed CPU regime (docs/cpu-demo.md, "The mixed regime"): all six ALFWorld task types of the 240 built-in
# training games (4-15 expert steps), held-out evaluation on 144 games that no run and no SFT base trains on
# (test_seen: rooms seen in training, test_unseen: rooms never seen; 24 a task type), groups of 4, 16 tasks
# per step, lr 1e-4, 150 steps; config/cpu.py's values otherwise. Fixed before any Agent-G² run in it; the
# base's and plain GRPO's probes are in docs/cpu-demo.md.
# $ bash run_all.sh --cpu --only mix6                        # the grid: every method and seed
# $ python train.py --preset cpu_mix6 --scheduler none       # plain GRPO
# $ python train.py --preset cpu_mix6                        # Agent-G²
# "_" names are not config keys (config.load_preset drops them)
from config import load_preset as _load_preset

locals().update(_load_preset("cpu"))  # a preset runs as plain assignments into this scope: take cpu.py's
out_dir = "runs/cpu_mix6"
task_types = ""                # every task type
group_size = 4
batch_tasks = 16               # 64 rollouts per step; 240 games: each drawn ~10 times in 150 steps
lr = 1e-4                      # 5e-4 wrecks GRPO on the long task types within two updates (cpu_pick2.py)
steps = 150
eval_split = "test_seen,test_unseen"
eval_games = 0                 # every held-out game (72 per split), greedy and sampled
eval_temperature = 0.4         # the sampled evaluation at the authors' T (paper.py); rollouts sample at T = 1
eval_every = 50
train_panel = 0                # the held-out games are the measure; the batch logs per-type success (by_type)
ckpt_every = 25
