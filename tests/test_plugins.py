"""Plug-ins (plumbing/plugins.py): README "Hack it"'s task sampler and reward blocks by hand, three research
ideas as one file each (a curriculum over tasks, a shaped reward, RLOO) trained for two steps through train.py,
their stats in log.jsonl, and for every kind a wrong signature that is one line before any model loads."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--batch_tasks", "4", "--group_size", "2", "--max_steps", "8", "--eval_games", "2", "--train_panel", "0",
         "--eval_every", "0", "--num_workers", "1", "--micro_batch", "16", "--ckpt_every", "0", "--steps", "2"]


def readme_block(name):
    """README "Hack it"'s Python block that opens with '# <name>'."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    return f"# {name}" + readme.split(f"# {name}")[1].split("```")[0]


@pytest.fixture()
def user_dir(tmp_path, monkeypatch):
    """A folder of a user's files (the README's blocks), on sys.path here and on PYTHONPATH for train.py."""
    d = tmp_path / "mine"
    d.mkdir()
    for name in ("my_sampler.py", "my_reward.py", "my_adv.py"):
        (d / name).write_text(readme_block(name))
    (d / "logged.py").write_text(
        "from my_reward import Visits\n\n\nclass LoggedVisits(Visits):  # Visits, its bonuses logged\n"
        "    def __init__(self, cfg):\n        super().__init__(cfg)\n        self.bonus = {}\n\n"
        "    def episode(self, ep):\n        r = super().episode(ep)\n"
        "        self.bonus[ep.eid] = r - super(Visits, self).episode(ep)\n        return r\n\n"
        "    def stats(self):\n        out, self.bonus = {'episodes': len(self.bonus), 'bonus': sum(self.bonus.values())}, {}\n"
        "        return out\n")
    monkeypatch.syspath_prepend(str(d))
    for m in ("my_sampler", "my_reward", "my_adv", "logged"):
        sys.modules.pop(m, None)
    return d


def test_the_readme_sampler_draws_in_proportion_to_its_weights(user_dir):
    """Curriculum with p(a) = 0 (weight 0.05), p(b) = 0.5 (0.3), c unseen (0.5: 0.3), one task a step: over 3,000
    steps a is drawn 0.05 / 0.65 = 7.7 % of the time, b and c 46.2 % each; its state round-trips; None is no
    outcome."""
    from config import get_config
    from my_sampler import Curriculum
    s = Curriculum(get_config(["--batch_tasks", "1"]), [{"id": i} for i in "abc"])
    s.observe(["a", "b", "c"], [0.0, 0.5, None])
    assert s.stats() == {"seen": 2}
    counts = np.bincount([s.batch(step)[0] for step in range(3000)], minlength=3) / 3000
    assert counts[0] == pytest.approx(0.05 / 0.65, abs=0.02) and counts[1] == pytest.approx(0.3 / 0.65, abs=0.03)
    t = Curriculum(get_config(["--batch_tasks", "1"]), [{"id": i} for i in "abc"])
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert [t.batch(k) for k in range(20)] == [s.batch(k) for k in range(20)]


def test_the_readme_reward_counts_first_visits_after_the_prefix(user_dir):
    """Visits on a won episode whose prefix (n = 1) went to desk 1: then desk 1 again (not new), shelf 2 (new),
    shelf 2 (not new), take mug 1 (not a place), sink 1 (new): 1 + 2 x 0.05 = 1.1, on every row (traj)."""
    from config import get_config
    from my_reward import Visits
    from rollout import Episode
    played = ["go to desk 1", "go to desk 1", "go to shelf 2", "go to shelf 2", "take mug 1 from shelf 2", "go to sink 1"]
    ep = Episode(0, 0, {}, 1, played, [], "", won=True, rows=[{"valid": True}] * 5)
    r = Visits(get_config([]))
    assert r.episode(ep) == pytest.approx(1.1) and r.rows(ep, r.episode(ep)) == pytest.approx([1.1] * 5)


def steps(out):
    return [json.loads(line) for line in open(os.path.join(out, "log.jsonl")) if '"eval"' not in line]


def run(out, *argv, env=None):
    p = subprocess.run([sys.executable, "train.py", *SMALL, "--out_dir", str(out), *argv], cwd=ROOT,
                       capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return steps(out)


@pytest.mark.slow
def test_three_ideas_each_one_file_train_two_steps(user_dir, tmp_path):
    """Two steps of train.py each, the same seed: the paper's run; a curriculum over tasks (its stats in log.jsonl:
    4 tasks seen after step 0, more or as many after step 1); the shaped reward (its bonus given on the run's own
    episodes, logged under "reward"; step 0 plays the paper run's episodes, so no group has a zero advantage that
    the paper's run gives signal to); RLOO (step 0's groups with no signal are the paper's: equal rewards)."""
    env = {"PYTHONPATH": str(user_dir)}
    paper = run(tmp_path / "paper", env=env)
    curriculum = run(tmp_path / "curriculum", "--task_sampler", "my_sampler.py:Curriculum", env=env)
    shaped = run(tmp_path / "shaped", "--reward", "logged:LoggedVisits", env=env)
    rloo = run(tmp_path / "rloo", "--advantage", "my_adv:RLOO", env=env)
    assert [r["task_sampler"]["seen"] for r in curriculum][0] == 4
    assert curriculum[1]["task_sampler"]["seen"] >= 4 and "task_sampler" not in paper[0]
    # 8 training episodes a step (and the first evaluation's, which plays through the same reply rule, at step 0)
    assert all(r["reward"]["episodes"] >= 8 for r in shaped) and sum(r["reward"]["bonus"] for r in shaped) > 0
    assert shaped[0]["zero_adv_groups"] <= paper[0]["zero_adv_groups"] and shaped[0]["success"] == paper[0]["success"]
    assert rloo[0]["zero_adv_groups"] == paper[0]["zero_adv_groups"] and rloo[0]["success"] == paper[0]["success"]
    assert all(math.isfinite(r["grad_norm"]) and r["update_rel"] > 0 for r in curriculum + shaped + rloo)


BAD = {  # kind: (flag, a file whose class gets one method's signature wrong, the method named in the error)
    "rule": ("--scheduler", "from scheduler import G2\n\n\nclass Bad(G2):\n    def depths(self, tasks):\n"
             "        return {}\n", "Bad.depths"),
    "hints": ("--hint_source", "class Bad:\n    def __init__(self, cfg, tasks):\n        pass\n\n"
              "    def hint(self):\n        return None\n\n    def observe(self, episodes):\n        return []\n\n"
              "    def state_dict(self):\n        return {}\n\n    def load_state_dict(self, sd):\n        pass\n",
              "Bad.hint"),
    "env": ("--env", "from envs import AlfEnv\n\n\nclass Bad(AlfEnv):\n    def step(self, ep):\n        return True\n",
            "Bad.step"),
    "loss": ("--loss_terms", "from grpo import Term\n\n\nclass Bad(Term):\n    def __call__(self):\n"
             "        return 0, {}\n", "Bad.__call__"),
    "advantage": ("--advantage", "class Bad:\n    def __init__(self, cfg, tasks):\n        pass\n\n"
                  "    def __call__(self, rows):\n        return 0, 0\n\n    def stats(self):\n        return {}\n",
                  "Bad.__call__"),
    "task_sampler": ("--task_sampler", "from plumbing.tasks import BatchOrder\n\n\nclass Bad(BatchOrder):\n"
                     "    def batch(self):\n        return []\n", "Bad.batch"),
    "reward": ("--reward", "from rollout import Reward\n\n\nclass Bad(Reward):\n    def __init__(self):\n"
               "        pass\n", "Bad.__init__"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_wrong_signature_is_one_line_before_any_model_loads(tmp_path, kind):
    """Each plug-in kind, its class with one method that cannot be called as the code calls it: train.py exits 2
    with one line naming the flag, the class's method and the signature it must accept, before the model (or the
    games) load; the same for a missing file, named with its .py suffix."""
    flag, source, method = BAD[kind]
    (tmp_path / f"bad_{kind}.py").write_text(source)
    p = subprocess.run([sys.executable, "train.py", flag, f"bad_{kind}.py:Bad", "--out_dir", str(tmp_path / "o")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr[-2000:]
    assert err[0].startswith(f"error: {flag} bad_{kind}.py:Bad: ") and method in err[0], err[0]
    assert "must be" in err[0] or "cannot be called as" in err[0]
    assert not os.path.exists(tmp_path / "o" / "log.jsonl")  # nothing started


def test_a_plugin_file_that_is_not_there_names_its_flag(tmp_path):
    from config import get_config
    with pytest.raises(SystemExit):
        get_config(["--task_sampler", "nowhere.py:Sampler"])
    p = subprocess.run([sys.executable, "train.py", "--reward", "nowhere.py:R"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip().startswith("error: --reward nowhere.py:R: cannot import 'nowhere'")
