# CPU preset on webshop-lite (this repo's offline WebShop look-alike; its numbers are labelled webshop-lite
# and are never WebShop numbers): config/cpu.py's values, with the lite SFT base and a reply budget
# that fits a search.
# $ python train.py --preset cpu_webshop                      # Agent-G²
# $ python train.py --preset cpu_webshop --scheduler none     # plain GRPO, same budget
# checkpoints/sft_webshop was made by this repo's SFT mode on the scripted expert's lite trajectories
# (docs/webshop.md: exact commands).
# "_" names are not config keys (config.load_preset drops them)
from config import load_preset as _load_preset

locals().update(_load_preset("cpu"))  # a preset runs as plain assignments into this scope: take cpu.py's
out_dir = "runs/cpu_webshop"
env = "webshop"
webshop_backend = "lite"
model = "checkpoints/sft_webshop"
task_types = ""                # WebShop uses every category
# the tiny tokenizer spends 35 tokens on the expert's median search reply (p90 43, max 51)
max_new_tokens = 64
# the first 100 eval goals (500-599), greedy and sampled; the full 1000 cost ~10x more
eval_games = 100
