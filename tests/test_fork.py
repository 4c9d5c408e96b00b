"""Forks a researcher makes from the method tier alone (README "Read this first"), each a flag or a few lines:
(a) the policy loss normalised per sequence instead of per token; (b) L_aux on the last k prefix steps only.
Each is checked for doing what was meant (on the update, by hand) and trains for two steps through train.py."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow
SMALL = ["--batch_tasks", "4", "--group_size", "2", "--max_steps", "8", "--eval_games", "2", "--train_panel", "0",
         "--eval_every", "0", "--num_workers", "1", "--micro_batch", "16", "--ckpt_every", "0", "--steps", "2"]
# (b) as a reader of train.py writes it: the loop's call to the update, given the aux rows of the last K steps
CALL = 'update = update_policy(rows, out["aux"])'
FORK = 'update = update_policy(rows, [a for a in out["aux"] if a["t"] >= a["n"] - 2])  # fork: the last 2 steps'
PROBE = '''from grpo import Term


class AuxSeen(Term):
    """A zero-loss term on the aux rows: how many the update saw, and the farthest from its prefix's end (n - t)."""
    rows, stats, maxima = "aux", ("aux_rows",), ("aux_far",)

    def __call__(self, mb):
        return (mb.lp * 0.0).sum(), {"aux_rows": float(len(mb.rows)),
                                     "aux_far": float(max(r["n"] - r["t"] for r in mb.rows))}
'''


def steps(out):
    return [json.loads(line) for line in open(os.path.join(out, "log.jsonl")) if '"eval"' not in line]


def run(root, out, *argv, env=None):
    p = subprocess.run([sys.executable, "train.py", *SMALL, "--out_dir", str(out), *argv], cwd=root,
                       capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return steps(out)


def test_fork_a_per_sequence_loss_is_the_mean_of_row_means(tmp_path):
    """(a) --loss_agg seq-mean-token-mean (grpo.agg_weights: each row its token mean, then the mean over rows). On
    test_grpo's fixed batch, pi_old from the trainer (ratio exactly 1 at the first step, nothing clipped), the pg
    term is -sum_i A_i / N over the N = 8 rows (zero-advantage rows count in N): advantages 1.5, -0.5, 0, -0.5, 0.7,
    -0.7, 0, 0 sum to 0.5, so pg = -0.0625; per token (token-mean) it weighs each row by its tokens instead. Then two
    training steps of train.py with the flag: finite losses, the weights move each step."""
    from test_grpo import fixed_batch, learner
    from plumbing.tiny import tiny_path
    from transformers import AutoModelForCausalLM, AutoTokenizer
    (tmp_path / "tiny").mkdir()
    path = tiny_path(str(tmp_path / "tiny"))
    tiny = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)
    rows, aux = fixed_batch(tiny[1])
    out = learner(tiny, ["--loss_agg", "seq-mean-token-mean", "--old_logprobs", "trainer"], trainer=True)[0].batch(
        rows, aux)
    assert out["ratio_dev"] == 0.0 and out["pg"] == pytest.approx(-0.0625, rel=1e-6)
    tokens = [len(r["response_ids"]) for r in rows]
    rows, aux = fixed_batch(tiny[1])
    per_token = learner(tiny, ["--loss_agg", "token-mean", "--old_logprobs", "trainer"], trainer=True)[0].batch(
        rows, aux)
    want = -sum(r["adv"] * t for r, t in zip(rows, tokens)) / sum(tokens)
    assert per_token["pg"] == pytest.approx(want, rel=1e-5) and abs(want + 0.0625) > 1e-3
    recs = run(ROOT, tmp_path / "run", "--loss_agg", "seq-mean-token-mean")
    assert len(recs) == 2 and all(r["update_rel"] > 0 and abs(r["pg"]) < 10 and r["skipped"] == 0 for r in recs)


def test_fork_b_aux_rows_from_the_last_k_prefix_steps(tmp_path):
    """(b) One line of train.py (FORK in place of CALL): the update gets the aux rows of each prefix's last 2 steps
    (t >= n - 2); AuxTerm divides by the aux tokens of the rows it is given (grpo.batch_counts), so L_aux stays a
    token mean over the kept targets. Two steps of the forked copy with a zero-loss probe term on the aux rows
    (--loss_terms): the update sees rows at most 2 steps from a prefix's end, while the steps' prefixes averaged
    more than 2 steps (mean_n), so unforked it would have seen rows farther back (tests/test_rollout.py: one aux
    row per prefix step)."""
    fork = tmp_path / "fork"
    shutil.copytree(ROOT, fork, ignore=shutil.ignore_patterns(".git", "runs", "results", "docs", "tests", "build",
                                                              "*.egg-info", "__pycache__"))
    source = open(fork / "train.py").read()
    assert source.count(CALL) == 1
    open(fork / "train.py", "w").write(source.replace(CALL, FORK))
    (tmp_path / "probe").mkdir()
    open(tmp_path / "probe" / "aux_seen.py", "w").write(PROBE)
    forked = run(fork, tmp_path / "forked", "--loss_terms", "aux_seen:AuxSeen", env={"PYTHONPATH": str(tmp_path / "probe")})
    assert all(0 < r["aux_far"] <= 2 and r["aux_rows"] > 0 and r["aux"] > 0 for r in forked)
    assert max(r["mean_n"] for r in forked) > 2
