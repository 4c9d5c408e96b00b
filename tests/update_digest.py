"""The update on a fixed batch, as numbers to compare across commits: python tests/update_digest.py REPO OUT_JSON.
Imports grpo / config and train.py's update_policy (tests/train_update.py) from REPO, builds the tiny model and a
fixed batch (step rows of two groups with engine log-probs, some with their trie of admissible replies, and three
expert rows), runs the update under three configurations and writes, per configuration, the update's stats and,
per parameter, the sum, the L2 norm and the first 8 values of the new weights and of the last mini-batch's
gradient. tests/test_grpo.py compares the current code against tests/data/update_digest.json, written by this
script (its grpo.Update form) at the commit the sampling-streams work started from."""
import copy
import json
import os
import sys
import tempfile

import torch

CONFIGS = {"cpu_pick2": [], "mini_batches_trainer_entropy": ["--ppo_mini_batch", "4", "--old_logprobs", "trainer",
                                                             "--entropy_coef", "0.01", "--kl_coef", "0.0"],
           "token_mean_unpacked": ["--loss_agg", "token-mean", "--pack_tokens", "0", "--eta", "1.0"]}
ACTS = ["go to desk 1", "take mug 1 from desk 1", "look", "inventory", "open drawer 2", "examine desk 1"]


def batch(tok):
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    reply = lambda a: enc(f"<action>{a}</action>") + [tok.eos_token_id]  # noqa: E731
    rows = []
    for j, adv in enumerate((1.5, -0.5, 0.0, -0.5, 0.7, -0.7, 0.0, 0.9)):
        r = {"prompt_ids": enc(f"task {j // 4}: put a mug in the sink. turn {j % 4}")[:6 + j],
             "response_ids": reply(ACTS[j % 6]), "adv": adv, "eid": j // 2, "gid": j // 4}
        r["logprobs"] = [-0.3 - 0.01 * k for k in range(len(r["response_ids"]))]
        if j % 3 == 0:
            r["allowed"] = [reply(a) for a in ACTS]
        rows.append(r)
    aux = [{"prompt_ids": enc(f"expert task {j}"), "response_ids": reply(ACTS[j]), "n": 1 + j % 2, "gid": j,
            "eid": 100 + j} for j in range(3)]
    return rows, aux


def digest(t):
    t = t.detach().double().flatten()
    return [t.sum().item(), t.norm().item(), t[:8].tolist()]


def main():
    root, out_path = sys.argv[1], sys.argv[2]
    sys.path.insert(0, root)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from config import get_config
    sys.path.insert(0, os.path.join(root, "tests"))
    from train_update import Learner
    from plumbing.tiny import tiny_path
    path = tiny_path(tempfile.mkdtemp())
    tok, base = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    result = {}
    for name, argv in CONFIGS.items():
        torch.manual_seed(0)
        cfg = get_config(["--preset", "cpu_pick2", *argv])
        m = copy.deepcopy(base)
        opt = torch.optim.AdamW(m.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                betas=(cfg.beta1, cfg.beta2))
        rows, aux = batch(tok)
        learn = Learner(cfg, m, opt, tok, trainer=cfg.old_logprobs == "trainer")
        out = learn.batch(rows, aux)
        result[name] = {"stats": {k: v for k, v in out.items() if isinstance(v, float)},
                        "params": {k: digest(p) for k, p in m.named_parameters()},
                        "grads": {k: digest(p.grad) for k, p in m.named_parameters() if p.grad is not None}}
    json.dump(result, open(out_path, "w"), indent=0)


if __name__ == "__main__":
    main()
