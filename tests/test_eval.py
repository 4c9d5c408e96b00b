"""eval.py: the Gaussian fit of the aligned profile, band classification and scheduler replay on hand-made curves,
the panel with a scripted expert and a scripted random policy, and `eval.py diagnose` end to end (tiny model)."""
import dataclasses
import json
import math
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from config import Config
from tools.diagnose import aligned_profile, band_of, d_star, fit_gaussian, replay
from eval import panel
from plumbing.report import wilson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gaussian_curves(sigma, n_tasks=12, a=0.25, seed=0):
    """Curves whose aligned p(1-p) is exactly a * exp(-dd^2 / (2 sigma^2)), increasing in d, with d*_i on the grid."""
    rng = np.random.default_rng(seed)
    grid = [round(x, 4) for x in np.arange(0, 1.0001, 0.1)]
    curves = {}
    for i in range(n_tasks):
        ds = grid[rng.integers(2, 9)]
        p = []
        for d in grid:
            g = a * math.exp(-(d - ds) ** 2 / (2 * sigma ** 2))  # = p (1 - p)
            root = math.sqrt(max(0.0, 0.25 - g))
            p.append(0.5 + (root if d > ds else -root))
        curves[f"t{i}"] = {"L": 10, "type": "x", "d": grid, "n": [min(math.ceil(d * 10 - 1e-9), 9) for d in grid],
                           "p": p}
    return curves


@pytest.mark.parametrize("sigma", [0.15, 0.22, 0.3])
def test_fit_recovers_sigma_from_aligned_profiles(sigma):
    curves = gaussian_curves(sigma)
    for c in curves.values():
        assert abs(c["p"][c["d"].index(d_star(c))] - 0.5) < 1e-9  # d* is where p = 0.5
    x, y, cnt = aligned_profile(curves)
    assert y[list(np.round(x, 6)).index(0.0)] == pytest.approx(0.25)
    a, s, r2 = fit_gaussian(x, y)
    assert abs(s - sigma) < 0.02 and r2 > 0.9 and a == pytest.approx(0.25, abs=0.01)


def test_fit_reports_a_poor_fit_honestly():
    x = np.linspace(-1, 1, 21)
    a, s, r2 = fit_gaussian(x, np.where(np.abs(x) < 0.5, 0.2, 0.0) + 0.05 * np.sign(x))  # a step, not a bump
    assert r2 < 0.9


def test_band_and_wilson():
    assert [band_of(p) for p in (0.0, 0.39, 0.4, 0.5, 0.6, 0.61, 1.0)] == \
        ["under", "under", "in", "in", "in", "over", "over"]
    lo, hi = wilson(0, 48)
    assert lo == 0.0 and 0.05 < hi < 0.1
    lo, hi = wilson(24, 48)
    assert lo < 0.5 < hi and hi - 0.5 == pytest.approx(0.5 - lo)


def test_replay_on_hand_made_curves():
    # one task, L = 5: p = 0 until n = 2, in band at n = 2, 1 from n = 3 on
    curves = {"a": {"L": 5, "type": "x", "d": [0.0, 0.2, 0.4, 0.6, 0.8], "n": [0, 1, 2, 3, 4],
                    "p": [0.0, 0.0, 0.5, 1.0, 1.0]}}
    cfg = dataclasses.replace(Config(), group_size=8, steps=200, max_steps=50)
    train = [{"id": "a", "L": 5}]
    rules = [("none", dict(scheduler="none")), ("fixed 0.5", dict(scheduler="fixed", fixed_ratio=0.5)),
             ("fixed 0.4", dict(scheduler="fixed", fixed_ratio=0.4)), ("linear", dict(scheduler="linear")),
             ("binary", dict(scheduler="binary", max_probes=2)), ("enum", dict(scheduler="enum")),
             ("g2 sigma 0", dict(scheduler="g2", sampling="none", mu0=0.4, lam=0.0)),
             ("cosine", dict(scheduler="cosine")), ("step", dict(scheduler="step")),
             ("target_acc", dict(scheduler="target_acc"))]
    rep = replay(curves, cfg, train, rules, step=0, draws=20, seed=0)
    assert rep["none"]["under"] == 1.0 and rep["none"]["rollouts_per_R"] == 1.0
    assert rep["fixed 0.5"]["over"] == 1.0  # ceil(0.5 * 5) = 3 expert actions: p = 1
    assert rep["fixed 0.4"]["in"] == 1.0  # 2 expert actions
    for k in ("linear", "cosine", "step", "target_acc"):  # step 0 of a schedule: n = L - 1
        assert rep[k]["over"] == 1.0 and rep[k]["rollouts_per_R"] == 1.0, k
    late = replay(curves, cfg, train, [("linear", dict(scheduler="linear")), ("cosine", dict(scheduler="cosine"))],
                  step=199, draws=2)
    assert late["linear"]["under"] == 1.0 and late["cosine"]["under"] == 1.0  # the last step: no hint
    assert rep["g2 sigma 0"]["in"] == 1.0  # mu = 0.4, no spread
    # binary search (M = 2) probes n = 2 first (a Bin(8, 0.5) draw) and pays for a second probe when it misses 4/8;
    # it ends at n = 2 unless an extreme draw ties with the second probe (then the shallower depth wins)
    assert rep["binary"]["in"] >= 0.9 and 1.0 < rep["binary"]["rollouts_per_R"] <= 2.0
    assert rep["enum"]["rollouts_per_R"] == 5.0 and rep["enum"]["in"] > 0.9  # every depth, 5 groups


class ScriptedPolicy:
    """Test double for the engine: the expert's next action, or a uniformly random admissible reply drawn, as the
    engines draw, from the call's one stream (seed an int) or from each request's own (a list of seeds)."""

    def __init__(self, tok, tasks, random_policy=False):
        self.tok, self.walk, self.random = tok, {t["walkthrough"][0]: t for t in tasks}, random_policy
        self.tasks = tasks

    def generate(self, prompts, max_new_tokens, temperature=1.0, seed=0, allowed=None):
        rngs = [random.Random(s) for s in seed] if isinstance(seed, list) else [random.Random(seed)] * len(prompts)
        out = []
        for p, al, rng in zip(prompts, allowed, rngs):
            text = self.tok.decode(p)
            task = text.split("task: ")[1].split("\n")[0]
            done = text.split("done: ")[1].split("\n")[0]
            k = 0 if done == "-" else len(done.split(" | "))
            if self.random:
                ids = rng.choice(al)
            else:
                walk = next(t["walkthrough"] for t in self.tasks if t["goal"] == task
                            and t["walkthrough"][:k] == ([] if done == "-" else done.split(" | ")))
                ids = self.tok.encode(f"<action>{walk[k]}</action>", add_special_tokens=False) + [self.tok.eos_token_id]
            out.append({"ids": ids, "logprobs": [0.0] * len(ids), "finished": True})
        return out


def test_panel_expert_random_and_determinism(tmp_path):
    from transformers import AutoTokenizer
    from envs import EnvPool
    from plumbing.tasks import load_tasks
    from plumbing.tiny import tiny_path
    from config import cache_dir
    tok = AutoTokenizer.from_pretrained(tiny_path(cache_dir()))
    tasks = load_tasks("valid_unseen")[::6]  # 8 games, every task type
    pool = EnvPool(2)
    try:
        # the task dict's goal (read from the game's grammar) is the sentence a reset shows: the scripted
        # policy finds each game's walkthrough by it
        got = pool.run([("reset", 10**6 + j, t["gamefile"], []) for j, t in enumerate(tasks)])
        pool.run([("close", 10**6 + j) for j in range(len(tasks))])
        assert [t["goal"] for t in tasks] == [g["task"] for g in got] and all(t["goal"] for t in tasks)
        cfg = dataclasses.replace(Config(), prompt="compact", constrained=True, max_steps=20, max_prompt_tokens=768,
                                  max_new_tokens=32, model="scripted")
        exp = panel(ScriptedPolicy(tok, tasks), pool, tok, tasks, cfg, [0], 0.0, str(tmp_path / "expert.json"))
        assert exp["mean"] == 1.0 and all(v == 1.0 for v in exp["per_type_mean"].values())
        assert exp["seeds"]["0"]["won_ids"] == [t["id"] for t in tasks]  # every game, in the panel's order
        rnd = [panel(ScriptedPolicy(tok, tasks, True), pool, tok, tasks, cfg, [0, 1], 1.0, str(tmp_path / f"r{i}.json"))
               for i in range(2)]
        assert rnd[0]["mean"] <= 0.15
        assert json.load(open(tmp_path / "r0.json")) == json.load(open(tmp_path / "r1.json"))  # same seeds, same JSON
        assert set(rnd[0]["seeds"]) == {"0", "1"} and len(rnd[0]["seeds"]["0"]["ci95"]) == 2
    finally:
        pool.close()


def test_webshop_panel_reports_success_and_score(tmp_path):
    """WebShop's two metrics through the panel and the in-loop evaluation: the expert scores 100 / 100; a policy
    that buys the right product without choosing its options scores partial credit and 0 % success."""
    from transformers import AutoTokenizer
    from config import cache_dir
    from envs import EnvPool, env_spec
    from plumbing.tasks import tasks_for
    from eval import in_loop_eval
    from plumbing.tiny import tiny_path
    tok = AutoTokenizer.from_pretrained(tiny_path(cache_dir()))
    cfg = dataclasses.replace(Config(), env="webshop", prompt="compact", constrained=True, max_steps=15,
                              max_prompt_tokens=768, max_new_tokens=32, model="scripted", out_dir=str(tmp_path))
    tasks = [t for t in tasks_for(cfg, "train") if t["L"] == 5][:6]  # goals with two options
    pool = EnvPool(1, env_spec(cfg))
    try:
        got = pool.run([("reset", 10**6 + j, t["gamefile"], []) for j, t in enumerate(tasks)])
        assert [t["goal"] for t in tasks] == [g["task"] for g in got]  # the task dict's goal, as reset shows it
        exp = panel(ScriptedPolicy(tok, tasks), pool, tok, tasks, cfg, [0], 0.0, str(tmp_path / "expert.json"))
        assert exp["mean"] == 1.0 and exp["score_mean"] == 100.0
        hasty = [{**t, "walkthrough": t["walkthrough"][:2] + ["click[buy now]"]} for t in tasks]  # no options
        res = in_loop_eval(ScriptedPolicy(tok, hasty), pool, tok, [("train_panel", hasty, [("", 0.0)])], cfg, step=0)
        assert res["train_panel"] == 0.0 and 0.0 < res["train_panel_score"] < 1.0  # a mean reward, not 1
    finally:
        pool.close()


@pytest.mark.slow
def test_diagnose_end_to_end_on_the_tiny_model(tmp_path):
    cmd = [sys.executable, "eval.py", "diagnose", "--model", "tiny", "--engine", "hf", "--tasks", "2", "--rollouts", "2",
           "--grid", "0.5", "--draws", "2", "--prompt", "compact", "--constrained", "1", "--max_steps", "6",
           "--max_new_tokens", "32", "--max_prompt_tokens", "768", "--num_workers", "1", "--out", str(tmp_path)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.load(open(tmp_path / "diagnose.json"))
    assert len(res["curves"]) == 2 and res["grid"] == [0.0, 0.5, 1.0]
    assert "g2" in res["replay"] and "enum every depth" in res["budget"]
    for f in ("fig2a_mismatch.png", "fig2b_budget.png", "fig3a_curves.png", "fig3b_profile.png"):
        assert os.path.getsize(tmp_path / f) > 1000
    assert "sigma" in p.stdout and "rollouts" in p.stdout


@pytest.mark.slow
def test_in_loop_and_offline_panel_agree(tmp_path):
    """train.py's in-loop evaluation and `eval.py panel` on the checkpoint it wrote give the same greedy numbers."""
    from test_train import train
    train(tmp_path, "--steps", "1", "--engine", "hf", "--task_types", "pick_and_place_simple", "--eval_games", "0",
          "--max_steps", "6", "--ckpt_every", "0")
    in_loop = [json.loads(line) for line in open(tmp_path / "log.jsonl") if '"eval"' in line][-1]
    assert in_loop["step"] == 1
    out = tmp_path / "panel.json"
    p = subprocess.run([sys.executable, "eval.py", "panel", "--model", str(tmp_path / "ckpt_000001"), "--split",
                        "valid_unseen", "--seeds", str(10**6 + 1), "--out", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.load(open(out))
    assert res["seeds"][str(10**6 + 1)]["n"] == 8  # the checkpoint's own config: one task type, its 8 games
    assert res["mean"] == in_loop["eval"]["val"]
    seed = res["seeds"][str(10**6 + 1)]  # the counts the tables' Wilson intervals come from
    assert in_loop["eval"]["counts"]["val"] == {"won": seed["won"], "n": 8,
                                                "per_type": {"pick_and_place_simple": [seed["won"], 8]}}


def test_table_groups_methods_and_refuses_to_mix_settings(tmp_path):
    from plumbing.report import table

    def run(name, seed, sched, preset="cpu", success=0.5):
        d = tmp_path / name
        d.mkdir()
        json.dump({"preset": preset, "games": "builtin", "task_types": "", "scheduler": sched, "seed": seed,
                   "out_dir": str(d), "git_commit": "abc123",
                   "argv": ["train.py", "--scheduler", sched, "--seed", str(seed), "--out_dir", str(d)]},
                  open(d / "config.json", "w"))
        with open(d / "log.jsonl", "w") as f:
            f.write(json.dumps({"step": 0, "eval": {"val": 0.1}}) + "\n")
            f.write(json.dumps({"step": 0, "t_step": 10.0, "rollouts_played": 64}) + "\n")
            f.write(json.dumps({"step": 1, "eval": {"val": success}}) + "\n")
        return str(d)
    for d in ("g2", "grpo", "paper"):
        (tmp_path / d).mkdir()
    runs = [run("g2/s0", 0, "g2", success=0.5), run("g2/s1", 1, "g2", success=0.7), run("grpo/s0", 0, "none", success=0.1)]
    md = table(runs)
    # 50 and 70 %: mean 60, sample std |70 - 50| / sqrt 2 = 14.1
    assert "| g2 | 2 | 60.0 ± 14.1 | 10.0 ± 0.0 | 64.0 ± 0.0 | `--scheduler g2` | abc123 |" in md
    assert "| *Tables 1-2: main comparison* |" in md
    assert "| grpo | 1 | 10.0 |" in md and "note:" not in md
    md = table(runs + [run("paper/s0", 0, "g2", preset="paper")])
    assert md.startswith("note: these runs come from 2 different") and md.count("| method |") == 2


def test_a_finished_runs_summary_names_its_host_and_a_read_one_does_not(tmp_path):
    """run_summary with wall_s (train.py at the end) records the host that ran the run: floats of one seed may
    differ by rounding between CPUs whose torch kernels differ (AVX2, AVX512). Computed later from the log (no wall_s),
    it names no host: the reader's machine did not run it."""
    import torch

    from plumbing.report import run_summary
    json.dump({"git_commit": "abc"}, open(tmp_path / "config.json", "w"))
    (tmp_path / "log.jsonl").write_text(json.dumps({"step": 0, "t_step": 2.0, "rollouts_played": 8}) + "\n")
    s = run_summary(str(tmp_path), wall_s=3.0)
    assert s["wall_s"] == 3.0 and s["s_per_step"] == 2.0 and s["rollouts"] == 8
    assert s["host"]["torch"] == torch.__version__
    assert s["host"]["gpu"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
    assert s["host"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and s["host"]["cpu"]
    assert s["host"]["threads"] == torch.get_num_threads()
    assert "host" not in run_summary(str(tmp_path))


def test_end_lines_report_first_and_last_eval():
    from plumbing.report import end_lines
    s = {"evals": [{"step": 0, "eval": {"val": 0.125, "val_sampled": 0.0625, "train_panel": 0.25}},
                   {"step": 20, "eval": {"val": 0.25, "val_sampled": 0.0625, "train_panel": 0.5}},
                   {"step": 40, "eval": {"val": 0.3125, "val_sampled": 0.1875, "train_panel": 0.75}}],
         "wall_s": 1446.0}
    first, second = end_lines(s, "runs/cpu").split("\n")
    assert first == ("[done] hint-free success, step 0 -> 40: validation greedy 12.5% -> 31.2% | "
                     "sampled 6.2% -> 18.8% | train panel greedy 25.0% -> 75.0% | wall 24.1 min")
    assert second.startswith("[done] files: runs/cpu/ (")
    assert second.endswith("figure: python eval.py dynamics runs/cpu --out runs/cpu/dynamics.png")
    # a set missing from an eval is left out rather than printed as 0
    s = {"evals": [{"step": 0, "eval": {"val": 0.5}}, {"step": 2, "eval": {"val": 0.5, "train_panel": 1.0}}]}
    assert end_lines(s, "r").split("\n")[0] == "[done] hint-free success, step 0 -> 2: validation greedy 50.0% -> 50.0%"


def test_table_pools_seeds_into_wilson_intervals_per_task_type(tmp_path):
    """Counts logged with each eval give each cell the Wilson interval of the games pooled over seeds, and a
    per-task-type table when there are several types. Hand values: 5 / 20 -> [11.2, 46.9]; 1 / 10 -> [1.8, 40.4];
    4 / 10 -> [16.8, 68.7] (p = (k + z²/2) / (n + z²) ± the Wilson half-width, z = 1.96)."""
    from plumbing.report import table

    def run(seed, val_counts, method="g2"):
        d = tmp_path / method / f"s{seed}"
        d.mkdir(parents=True)
        counts = {"val": {"won": sum(w for w, _ in val_counts.values()), "n": sum(n for _, n in val_counts.values()),
                          "per_type": {t: list(c) for t, c in val_counts.items()}}}
        final = {"val": counts["val"]["won"] / counts["val"]["n"]}
        json.dump({"summary": 1, "cfg": {"preset": "cpu", "games": "builtin", "task_types": "a,b", "seed": seed,
                                         "argv": ["train.py"], "git_commit": "abc"},
                   "final": {**final, "counts": counts} if method == "g2" else final, "evals": [],
                   "s_per_step": 1.0, "rollouts_per_step": 64.0}, open(d / "summary.json", "w"))
        return str(d)
    md = table([run(0, {"a": (2, 5), "b": (0, 5)}), run(1, {"a": (2, 5), "b": (1, 5)}),
                run(0, {"a": (1, 5), "b": (0, 5)}, method="grpo")])  # grpo: logged without counts
    assert "| g2 | 2 | 25.0 ± 7.1 [11–47] |" in md  # 20 and 30 %: sample std 10 / sqrt 2 = 7.1
    assert "| g2 | a | 40.0 [17–69] (4 / 10) |" in md and "| g2 | b | 10.0 [2–40] (1 / 10) |" in md
    assert "| grpo | 1 | 10.0 | 1.0 |" in md and "| grpo | a |" not in md and "Wilson" in md


def test_window_table_pools_seeds_per_block_of_steps(tmp_path):
    """Windows 0-9, 10-49, 50-99, 100-119 for a 120-step run; a 70-step seed beside it (still running). Seed 0 wins
    every batch, seed 1 none: pooled over records, 50-99 holds 50 of seed 0's steps and 20 of seed 1's -> 50 / 70."""
    from plumbing.report import window_table
    runs = []
    for seed, (steps, success) in enumerate([(120, 1.0), (70, 0.0)]):
        d = tmp_path / "grpo" / f"s{seed}"
        d.mkdir(parents=True)
        with open(d / "log.jsonl", "w") as f:
            for step in range(steps):
                f.write(json.dumps({"step": step, "success": success, "all0": 1.0 - success, "in_band": 0.0,
                                    "all1": success, "mean_r": 0.0, "rollouts_played": 64, "t_step": 2.0}) + "\n")
        runs.append(str(d))
    md = window_table(runs).splitlines()
    assert md[2:] == ["| grpo | 2 | 0–9 | 0.500 | 50 % | 0 % | 50 % | 0.00 | 64 | 2.0 |",
                      "| grpo | 2 | 10–49 | 0.500 | 50 % | 0 % | 50 % | 0.00 | 64 | 2.0 |",
                      "| grpo | 2 | 50–99 | 0.714 | 29 % | 0 % | 71 % | 0.00 | 64 | 2.0 |",
                      "| grpo | 1 | 100–119 | 1.000 | 0 % | 0 % | 100 % | 0.00 | 64 | 2.0 |"]


def test_trailing_mean_and_the_figure_on_hinted_and_plain_runs(tmp_path, capsys):
    from plumbing.report import dynamics, trailing_mean
    assert trailing_mean([1, 2, 3, 4], 2).tolist() == [1.5, 2.5, 3.5] and trailing_mean([1, 2], 10).tolist() == [1.5]
    runs = []
    for name, r in (("g2", 0.5), ("grpo", 0.0)):
        d = tmp_path / name / "s0"
        d.mkdir(parents=True)
        with open(d / "log.jsonl", "w") as f:
            f.write(json.dumps({"step": 0, "eval": {"val": 0.0, "train_panel": 0.25}}) + "\n")
            for step in range(12):
                f.write(json.dumps({"step": step, "success": 0.5, "all0": 0.2, "in_band": 0.3, "all1": 0.1,
                                    "mean_r": r, "mu_global": 0.9, "mu_k": [r, r], "sigma_k": [0.1, 0.2],
                                    "zero_adv_groups": 1, "groups": 4, "rollouts_played": 64, "t_step": 1.0,
                                    "update_rel": 1e-3}) + "\n")
        runs.append(str(d))
    dynamics(runs, str(tmp_path / "fig.png"))
    assert (tmp_path / "fig.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "| g2/s0 | 0 | 25.0 |" in out and "| grpo | 1 | 10–11 | 0.500 |" in out


def test_the_figure_and_eval_table_show_held_out_splits(tmp_path, capsys):
    """A regime evaluated on held-out games (test_seen, test_unseen) gets the figure's two success panels and
    eval_table's columns: seen rooms left, unseen right. Hand values: 0.25 -> 25.0, 0.125 -> 12.5, 0.5 -> 50.0."""
    from plumbing.report import dynamics
    d = tmp_path / "g2" / "s0"
    d.mkdir(parents=True)
    with open(d / "log.jsonl", "w") as f:
        f.write(json.dumps({"step": 0, "eval": {"test_seen": 0.25, "test_seen_sampled": 0.125,
                                                "test_unseen": 0.5, "test_unseen_sampled": 0.0, "counts": {}}}) + "\n")
        for step in range(3):
            f.write(json.dumps({"step": step, "success": 0.5, "all0": 0.2, "in_band": 0.3, "all1": 0.1,
                                "mean_r": 0.5, "mu_global": 0.9, "mu_k": [0.5], "sigma_k": [0.1],
                                "zero_adv_groups": 1, "groups": 4, "rollouts_played": 64, "t_step": 1.0,
                                "update_rel": 1e-3}) + "\n")
    fig = dynamics([str(d)], str(tmp_path / "fig.png"))
    seen, unseen = fig.axes[0].get_lines(), fig.axes[1].get_lines()
    assert [tuple(x.get_ydata()) for x in seen] == [(25.0,), (12.5,)]
    assert [tuple(x.get_ydata()) for x in unseen] == [(50.0,), (0.0,)]
    out = capsys.readouterr().out
    assert "| run | step | test_seen greedy | test_seen sampled | test_unseen greedy | test_unseen sampled |" in out
    assert "| g2/s0 | 0 | 25.0 | 12.5 | 50.0 | 0.0 |" in out


def test_authors_draw_replays_textworlds_seeded_streams():
    """The authors' ALFWorld validation: worker i's games come from TextWorld's own stream, seeded 1000 + i
    (TextworldBatchGymEnv.seed: a RandomState shuffle of the game list, then shuffled_cycle, which reshuffles after
    each pass); validation k plays the k-th game of every stream. TextWorld's functions are the oracle here."""
    from textworld.gym.envs.utils import shuffled_cycle
    from eval import authors_draw
    games = [f"game{j:02d}" for j in range(7)]  # a pass is 7 games: k = 0..15 crosses two reshuffles
    streams = []
    for i in range(128):
        rng = np.random.RandomState(1000 + i)
        order = list(games)
        rng.shuffle(order)
        it = shuffled_cycle(order, rng=rng)
        streams.append([next(it) for _ in range(16)])
    for k in (0, 1, 6, 7, 8, 15):
        assert [games[j] for j in authors_draw(len(games), k, "alfworld")] == [s[k] for s in streams]
    first = authors_draw(len(games), 0, "alfworld")
    assert len(first) == 128 and len(set(first)) == 7  # 128 episodes of 7 games: repeats, as theirs


def test_authors_draw_webshop_keeps_one_generator_running():
    """WebShop: RandomState(1000).choice(pool, 128, replace=False) once per validation, the generator running on:
    validation k is its (k+1)-th draw, 128 distinct goals each [.../webshop/envs.py, WebshopMultiProcessEnv.reset]."""
    from eval import authors_draw
    rng = np.random.RandomState(1000)
    pool = list(range(500, 1000))  # goal indices; positions 0..499
    draws = [rng.choice(pool, size=128, replace=False).tolist() for _ in range(3)]
    for k in range(3):
        assert [pool[j] for j in authors_draw(500, k, "webshop")] == draws[k]
        assert len(set(draws[k])) == 128
    assert draws[0] != draws[1]


def test_evaluations_due_as_the_authors_and_the_panel_schedule_them():
    """Paper preset: the authors' draw at 0, 5, 10, ... (test_freq 5, val_before_train) and at the end; the panel at
    0, 50, 100, ... and at the end. authors_index counts the draws before: step 5 is validation 1, the end of a
    203-step run (draws at 0, 5, ..., 200, then 203) is validation 42."""
    from config import get_config
    from eval import authors_index, eval_sets, eval_splits, evals_due
    cfg = get_config(["--preset", "paper", "--steps", "203"])
    due = {s: evals_due(cfg, s) for s in (0, 1, 5, 49, 50, 100, 200, 203)}
    assert due == {0: (True, True), 1: (False, False), 5: (False, True), 49: (False, False), 50: (True, True),
                   100: (True, True), 200: (True, True), 203: (True, True)}
    assert [authors_index(s, 5) for s in (0, 5, 10, 200, 203)] == [0, 1, 2, 40, 41]
    assert eval_splits(cfg) == [("valid_seen", "valid_seen"), ("valid_unseen", "valid_unseen")]
    seen = [{"id": f"s{j}", "task_type": "x"} for j in range(9)]
    unseen = [{"id": f"u{j}", "task_type": "x"} for j in range(4)]
    sets = eval_sets(cfg, 0, [("valid_seen", seen), ("valid_unseen", unseen)], [])
    assert [(n, len(t), d) for n, t, d in sets] == [
        ("valid_seen", 9, [("", 0.0), ("_sampled", 0.4)]), ("valid_unseen", 4, [("", 0.0), ("_sampled", 0.4)]),
        ("authors_valid_seen", 128, [("_sampled", 0.4)])]  # greedy and T = 0.4 on both splits; their draw at 0.4
    assert [n for n, _, _ in eval_sets(cfg, 5, [("valid_seen", seen), ("valid_unseen", unseen)], [])] == \
        ["authors_valid_seen"]
    cpu = get_config([])  # the CPU demo: the panel only, one split logged as 'val', sampled at T = 1
    assert eval_splits(cpu) == [("val", "valid_unseen")] and evals_due(cpu, 5) == (False, False)
    assert [(n, d) for n, _, d in eval_sets(cpu, 20, [("val", unseen)], seen)] == [
        ("val", [("", 0.0), ("_sampled", 1.0)]), ("train_panel", [("", 0.0), ("_sampled", 1.0)])]


def test_summary_gives_the_last_and_the_best_evaluation(tmp_path):
    """best_evals: each key's highest value and its step (the earliest of ties); end_lines prints both."""
    from plumbing.report import best_evals, end_lines
    evals = [{"step": 0, "eval": {"valid_seen": 0.1, "authors_valid_seen_sampled": 0.2, "counts": {}}},
             {"step": 5, "eval": {"authors_valid_seen_sampled": 0.5}},
             {"step": 10, "eval": {"valid_seen": 0.4, "authors_valid_seen_sampled": 0.5}},
             {"step": 12, "eval": {"valid_seen": 0.3, "authors_valid_seen_sampled": 0.25}}]
    best = best_evals(evals)
    assert best == {"valid_seen": {"value": 0.4, "step": 10}, "authors_valid_seen_sampled": {"value": 0.5, "step": 5}}
    line = end_lines({"evals": evals, "best": best}, str(tmp_path)).splitlines()[0]
    assert "valid_seen greedy 10.0% -> 30.0% (best 40.0% at 10)" in line
    assert "authors' draw on valid_seen sampled 20.0% -> 25.0% (best 50.0% at 5)" in line


def test_paper_comparison_columns_show_the_last_and_the_best_evaluation(tmp_path):
    """The paper presets' table: valid_seen and valid_unseen (sampled at T = 0.4 and greedy) and the authors' draw,
    each at the last evaluation and at its best one, mean ± std over seeds: by hand, seed 0 ends at 40 % on
    valid_seen greedy after a best of 60 %, seed 1 ends at 50 % (its best): last 45.0 ± 7.1, best 55.0 ± 7.1 (the
    sample std of two values is their distance / sqrt 2; sampled v / 2: 22.5 ± 3.5, unseen v / 4: 11.2 ± 1.8)."""
    from plumbing.report import table

    def run(seed, curve):
        d = tmp_path / "g2" / f"s{seed}"
        d.mkdir(parents=True)
        json.dump({"preset": "paper", "games": "official", "task_types": "", "scheduler": "g2", "seed": seed,
                   "out_dir": str(d), "git_commit": "abc123", "argv": ["train.py", "--seed", str(seed)]},
                  open(d / "config.json", "w"))
        with open(d / "log.jsonl", "w") as f:
            for step, v in curve:
                f.write(json.dumps({"step": step, "eval": {"valid_seen": v, "valid_seen_sampled": v / 2,
                                                           "valid_unseen": v / 4, "authors_valid_seen_sampled": v}}) + "\n")
            f.write(json.dumps({"step": 0, "t_step": 10.0, "rollouts_played": 128}) + "\n")
        return str(d)
    md = table([run(0, [(0, 0.1), (50, 0.6), (200, 0.4)]), run(1, [(0, 0.2), (200, 0.5)])])
    head = [x for x in md.splitlines() if x.startswith("| method |")][0]
    assert head.startswith("| method | seeds | valid_seen_sampled % last | valid_seen_sampled % best | valid_seen % last "
                           "| valid_seen % best | valid_unseen % last | valid_unseen % best | "
                           "authors_valid_seen_sampled % last | authors_valid_seen_sampled % best |")
    row = [x for x in md.splitlines() if x.startswith("| g2 |")][0]
    assert row.startswith("| g2 | 2 | 22.5 ± 3.5 | 27.5 ± 3.5 | 45.0 ± 7.1 | 55.0 ± 7.1 | 11.2 ± 1.8 | 13.8 ± 1.8 | "
                          "45.0 ± 7.1 | 55.0 ± 7.1 |")


@pytest.mark.slow
def test_panel_writes_under_runs_never_into_the_checkpoint(tmp_path):
    """`eval.py panel` on the shipped checkpoint, without --out: its JSON goes to runs/eval/<model name>/ under
    the working directory, and the checkpoint directory is left as it was."""
    model = os.path.join(ROOT, "checkpoints", "sft_base")
    before = sorted(os.listdir(model))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "panel", "--model", model, "--split",
                        "valid_unseen", "--task_types", "pick_and_place_simple", "--max_steps", "6",
                        "--num_workers", "1", "--seeds", "0"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = tmp_path / "runs" / "eval" / "sft_base" / "panel_valid_unseen_greedy.json"
    assert json.load(open(out))["seeds"]["0"]["n"] == 8
    assert sorted(os.listdir(model)) == before


def test_t_quantiles_match_the_printed_table():
    """Student's t quantiles against a printed t table (two-sided 95 %: df 2 4.303, df 4 2.776, df 8 2.306;
    one-sided 80 %: df 4 0.941, df 8 0.889) and the normal limit (df 1000: 1.962)."""
    from plumbing.tables import t_quantile
    for p, df, want in [(0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 8, 2.306), (0.8, 4, 0.941), (0.8, 8, 0.889),
                        (0.975, 1000, 1.962)]:
        assert abs(t_quantile(p, df) - want) < 1e-3, (p, df)


def test_intervals_and_detectable_differences_by_hand():
    """t interval of [1, 2, 3]: mean 2, sd 1, half width 4.303 / sqrt 3 = 2.484. Detectable at 80 % power: paired,
    sd 10 over 5 seeds: (2.776 + 0.941) 10 / sqrt 5 = 16.62; two groups of 5, pooled sd 10: (2.306 + 0.889) 10
    sqrt(2 / 5) = 20.21. Over seeds: constant seeds give the constant; 40, 50, 60 give 50 -+ 4.303 * 10 / sqrt 3 =
    24.8 -> 25.2-74.8; one seed has no interval."""
    from plumbing.tables import detectable, seed_interval, t_interval
    m, h = t_interval([1, 2, 3])
    assert m == 2 and abs(h - 2.484) < 1e-3
    assert abs(detectable(10, 5) - 16.62) < 0.01 and abs(detectable(10, 5, 5) - 20.21) < 0.01
    assert seed_interval([40, 40, 40]) == "40.0–40.0" and seed_interval([40, 50, 60]) == "25.2–74.8"
    assert seed_interval([40]) == "—"


def test_regime_tables_have_the_papers_shape(tmp_path):
    """A setting evaluated on the held-out splits gets Tables 1-3. Hand values: g2 seed 0 wins seen 3 / 4 (Pick 2 / 2,
    Look 1 / 2) and unseen 1 / 4 (Pick 1 / 2, Look 0 / 2): all 4 / 8 = 50 %, Pick 3 / 4 = 75 %, Look 1 / 4 = 25 %;
    seed 1 wins 2 / 8 = 25 % (Pick 2 / 4 = 50 %, Look 0 / 4): all 37.5 ± 17.7, Pick 62.5 ± 17.7 (the sample std of two
    values a and b is |a - b| / sqrt 2: 25 / 1.414 = 17.7; seen 75 and 25: 35.4). grpo seed 0 wins
    1 / 8 = 12.5 %, seed 1 0 / 8. Paired differences grpo - g2: -37.5 and -25.0 -> -31.2; their sd 8.84 over 2
    seeds: half width 12.706 * 8.84 / sqrt 2 = 79.4. Cost: g2 2 s and 96 rollouts a step, grpo 1 s and 64: 2.00,
    1.50; wall 150 steps x 2 s + 60 s = 6 min. Wilson of g2's pooled 6 / 16: 18.5-61.4 %. t over g2's two seeds 50,
    25: 37.5 -+ 12.706 * 17.68 / sqrt 2 = 158.8 -> -121.3-196.3; one seed (the base): none."""
    from plumbing.report import table

    def run(method, seed, seen, unseen, s_step, rollouts):  # seen / unseen: {type: (won, n)}
        d = tmp_path / method / f"s{seed}"
        d.mkdir(parents=True)
        counts = {}
        for split, c in (("test_seen", seen), ("test_unseen", unseen)):
            for suffix in ("", "_sampled"):
                counts[split + suffix] = {"won": sum(w for w, _ in c.values()), "n": sum(n for _, n in c.values()),
                                          "per_type": {t: list(x) for t, x in c.items()}}
        final = {k: v["won"] / v["n"] for k, v in counts.items()}
        json.dump({"cfg": {"preset": "cpu_mix6", "games": "builtin", "task_types": "", "seed": seed,
                           "argv": ["train.py"], "git_commit": "abc"},
                   "final": {**final, "counts": counts}, "s_per_step": s_step,
                   "evals": [{"step": 0, "eval": {"counts": counts}}] if (method, seed) == ("grpo", 1) else [],
                   "rollouts_per_step": rollouts, "wall_s": 150 * s_step + 60}, open(d / "summary.json", "w"))
        return str(d)
    P, L = "pick_and_place_simple", "look_at_obj_in_light"
    md = table([run("g2", 0, {P: (2, 2), L: (1, 2)}, {P: (1, 2), L: (0, 2)}, 2.0, 96.0),
                run("g2", 1, {P: (1, 2), L: (0, 2)}, {P: (1, 2), L: (0, 2)}, 2.0, 96.0),
                run("grpo", 0, {P: (1, 2), L: (0, 2)}, {P: (0, 2), L: (0, 2)}, 1.0, 64.0),
                run("grpo", 1, {P: (0, 2), L: (0, 2)}, {P: (0, 2), L: (0, 2)}, 1.0, 64.0)])
    assert "| method | seeds | Pick | Look | seen | unseen | all |" in md and md.count("*Table 1 (") == 2
    assert "| Agent-G² | 2 | 62.5 ± 17.7 | 12.5 ± 17.7 | 50.0 ± 35.4 | 25.0 ± 0.0 | 37.5 ± 17.7 | -121.3–196.3 | " \
           "18.5–61.4 (6 / 16) |" in md
    # wall: g2 (150 * 2 + 60) / 60 = 6.0 min, grpo (150 * 1 + 60) / 60 = 3.5 min, on each seed
    assert "| Agent-G² | 2 | 2.0 ± 0.0 | 2.00 | 96.0 ± 0.0 | 1.50 | 6.0 ± 0.0 | s0 6.0, s1 6.0 |" in md
    assert "| GRPO | 2 | 1.0 ± 0.0 | 1.00 | 64.0 ± 0.0 | 1.00 | 3.5 ± 0.0 | s0 3.5, s1 3.5 |" in md
    assert "Wall time: 4 runs, 0.3 h in all." in md  # (2 * 360 + 2 * 210) / 3600 = 0.32
    assert "| GRPO | 2 | -31.2 [-110.7, +48.2] |" in md
    brief = table([os.path.join(str(tmp_path), m, f"s{k}") for m in ("g2", "grpo") for k in (0, 1)], brief=True)
    assert "| Agent-G² | 2 | 37.5 ± 17.7 [-121.3–196.3] | 37.5 ± 17.7 [-121.3–196.3] | 37.5 ± 17.7 |  | 2.00 | 1.50 |" in brief
    assert "*Table 1" not in brief  # Pick and Look are the short types: no long type, an empty cell
    # the base row: each seed's evaluation at step 0, here seed 1's alone (grpo/s1's counts, 0 of 8: Wilson 0-32.4 %)
    assert "| SFT base (step 0) | 1 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | — | 0.0–32.4 (0 / 8) |" in md
    assert "| SFT base (step 0) | 1 | 0.0 [—] | 0.0 [—] | 0.0 |  | | |" in brief
    assert "Agent-G² − GRPO, 2 and 2 seeds (unpaired): greedy +31.2 points" in md
    # one seed a side: the difference alone, no interval (-37.5: grpo/s0 12.5 % - g2/s0 50 %)
    one = table([os.path.join(str(tmp_path), m, "s0") for m in ("g2", "grpo")])
    assert "| GRPO | 1 | -37.5 [—] | — | -37.5 [—] | — |" in one and "nan" not in one
    assert "greedy +37.5 points (one seed a side: no spread yet)" in one
    # the same paired difference on both seeds (fixed 3 / 8 and 1 / 8 against g2's 4 / 8 and 2 / 8: -12.5 twice):
    # its t interval would have width 0 and its detectable difference 0.0; the table prints — for both
    same = table([run("fixed", 0, {P: (2, 2), L: (0, 2)}, {P: (1, 2), L: (0, 2)}, 1.0, 64.0),
                  run("fixed", 1, {P: (1, 2), L: (0, 2)}, {P: (0, 2), L: (0, 2)}, 1.0, 64.0)]
                 + [os.path.join(str(tmp_path), "g2", f"s{k}") for k in (0, 1)])
    assert "| fixed ratio 0.5 | 2 | -12.5 [—] | — | -12.5 [—] | — |" in same and "0.0 |" not in same.split("Table 3")[1]


def test_tables_give_the_sample_std_over_seeds_and_the_base_on_every_seed():
    """mean ± std cells use the sample std (ddof 1). By hand: 1, 2, 3, 4 -> mean 2.5, squared deviations 2.25 +
    0.25 + 0.25 + 2.25 = 5, / 3 -> 1.667, sqrt 1.29 (the population std would be sqrt(5 / 4) = 1.12). The base row
    takes each seed's step-0 evaluation once (here seeds 0 and 1: 2 / 8 and 4 / 8 sampled, 25 % and 50 %: 37.5 ±
    17.7), greedy 3 / 8 on both (37.5 ± 0.0), not the first run's alone."""
    from plumbing.tables import base_rows, mean_std, regime_tables
    assert mean_std([1.0, 2.0, 3.0, 4.0]) == "2.5 ± 1.3"
    assert mean_std([5.0]) == "5.0" and mean_std([]) == ""

    def summary(seed, won_sampled):
        counts = {}
        for split in ("test_seen", "test_unseen"):
            counts[split] = {"won": 3 if split == "test_seen" else 0, "n": 4,
                             "per_type": {"pick_and_place_simple": [3 if split == "test_seen" else 0, 4]}}
            w = won_sampled if split == "test_seen" else 0
            counts[split + "_sampled"] = {"won": w, "n": 4, "per_type": {"pick_and_place_simple": [w, 4]}}
        ev = {"counts": counts}
        return {"cfg": {"seed": seed}, "final": ev, "evals": [{"step": 0, "eval": ev}],
                "s_per_step": 1.0, "rollouts_per_step": 64.0}
    rows = {"g2": [summary(0, 2), summary(1, 4)], "grpo": [summary(0, 2), summary(1, 4)]}
    assert [b["cfg"]["seed"] for b in base_rows(rows)] == [0, 1]
    md = regime_tables(rows)
    assert "| SFT base (step 0) | 2 | 37.5 ± 0.0 | 75.0 ± 0.0 | 0.0 ± 0.0 | 37.5 ± 0.0 |" in md  # greedy
    assert "| SFT base (step 0) | 2 | 37.5 ± 17.7 | 75.0 ± 35.4 | 0.0 ± 0.0 | 37.5 ± 17.7 |" in md  # sampled


def test_transcripts_show_the_action_the_rollout_played(tmp_path):
    """write_transcripts prints each row's action as the rollout read and played it (row["action"]), not a fresh parse
    of the reply: under a reply rule that lower-cases (--parse_lower, the authors' projection) the reply
    "<action>Go To Desk 1</action>" was played as "go to desk 1"."""
    from types import SimpleNamespace
    from eval import write_transcripts
    tok = SimpleNamespace(decode=lambda ids, skip_special_tokens=False: "prompt")
    out = {"episodes": [{"eid": 7, "task_id": "t", "n": 0, "won": False, "reward": 0.0, "steps": 1, "invalid": 0,
                         "error": None}],
           "rows": [{"eid": 7, "t": 0, "prompt_ids": [1], "response_ids": [2], "valid": True,
                     "text": "<action>Go To Desk 1</action>", "action": "go to desk 1"}]}
    write_transcripts(str(tmp_path / "t.txt"), out, tok, 1)
    text = open(tmp_path / "t.txt").read()
    assert "--- action: 'go to desk 1' valid True" in text and "'Go To Desk 1'" not in text


def test_same_records_compares_every_field_but_timings():
    """tools/same_records.py on hand-made records: timings (t_*) never count; an int that differs is named; floats
    are measured relative at |x| >= 1e-3 (1.0 against 1.001: 1e-3 of 1.001) and absolute below (pg 1e-9 against
    3e-9: 2e-9 / 1e-3 = 2e-6); a missing key is named."""
    from tools.same_records import compare
    a = [{"step": 0, "t_step": 1.0, "n": [3, 4], "aux": 1.0, "pg": 1e-9}]
    b = [{"step": 0, "t_step": 9.0, "n": [3, 4], "aux": 1.001, "pg": 3e-9}]
    diffs, worst = compare(a, b)
    assert diffs == [] and worst["[0].aux"] == pytest.approx(0.001 / 1.001) and worst["[0].pg"] == pytest.approx(2e-6)
    assert compare(a, [dict(b[0], n=[3, 5])])[0] == ["[0].n[1]: 4 against 5"]
    assert compare(a, [{k: v for k, v in b[0].items() if k != "pg"}])[0] == ["[0]: keys ['pg']"]
