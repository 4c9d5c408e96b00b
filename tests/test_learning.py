"""Does the update learn, and in the right direction? Real train.py runs on the tiny model and 4 built-in games
(pick_and_place_simple, expert lengths 5-8: 2-5 policy steps within max_steps 9),
one expert action from the end (--scheduler fixed --fixed_ratio 1), constrained decoding, HF engine (seeded).

- reward +1 for a win: sampled success at that depth must clearly rise within a few GRPO steps;
- the same run with the reward negated (--reward_scale -1): success must clearly fall;
- every step is on-policy: ratio = 1 (within 1e-4) and clipfrac = 0 (the trainer scores the same trie-restricted
  distribution the engine sampled; an unmasked trainer gives ratios far from 1 here);
- a step without signal (every reward 0, KL at the reference) changes no weight.

A wrong sign, a missing mask, or broken advantage normalisation fails one of these. During development (the
split's first 4 games, 8 steps at lr 3e-3): 0.31 -> 1.0 (reward +1) and 0.31 -> 0.0 (reward -1), ~70 s per run;
with the trainer's mask removed, clipfrac was 1.0."""
import json
import os

import pytest
from safetensors.torch import load_file

from test_train import records, train

LEARN = ["--model", "tiny", "--engine", "hf", "--scheduler", "fixed", "--fixed_ratio", "1.0", "--train_games", "4",
         "--task_types", "pick_and_place_simple", "--batch_tasks", "4", "--group_size", "8", "--max_steps", "9", "--steps", "6", "--lr", "3e-3",
         "--warmup_frac", "0", "--eta", "0", "--kl_coef", "0", "--loss_agg", "episode", "--eval_games", "-1",
         "--ckpt_every", "0"]
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sign", [1, -1])
def test_grpo_moves_success_with_the_reward(tmp_path, sign):
    train(tmp_path, *LEARN, "--reward_scale", str(sign))
    recs = records(tmp_path)
    succ = [r["success"] for r in recs]
    for r in recs:
        assert r["clipfrac"] == 0.0 and r["ratio_dev"] < 1e-4, r  # on-policy at every (single) pass
        assert r["sync_err"] < 1e-4
    start, end = succ[0], sum(succ[-2:]) / 2
    if sign > 0:
        assert end >= start + 0.3 and end >= 0.7, succ
    else:
        assert end <= start - 0.15 and end <= 0.1, succ


def test_a_step_without_signal_changes_no_weight(tmp_path):
    from config import cache_dir
    from plumbing.tiny import tiny_path
    train(tmp_path, *LEARN, "--steps", "1", "--reward_scale", "0", "--kl_coef", "0.01")
    rec = records(tmp_path)[0]
    assert rec["grad_norm"] == 0.0 and not rec["stepped"] and rec["update_rel"] == 0.0
    before = load_file(os.path.join(tiny_path(cache_dir()), "model.safetensors"))
    after = load_file(os.path.join(tmp_path, "ckpt_000001", "model.safetensors"))
    assert all((before[k] == after[k]).all() for k in after)
    assert json.load(open(os.path.join(tmp_path, "config.json")))["reward_scale"] == 0.0
