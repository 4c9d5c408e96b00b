"""run_all.sh: the paper grid as a dry run, and every grid entry for one step at toy scale (--cpu --smoke)."""
import atexit
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROUPS = ["main", "ablations", "clusters", "sft", "aux_rl", "released", "reference", "webshop"]  # run_all.sh's --only values


@functools.lru_cache(None)
def this_python_first():
    """A PATH whose `python` is the interpreter running the tests (sys.executable), for run_all.sh's
    `python` commands."""
    d = tempfile.mkdtemp(prefix="g2-python-")
    atexit.register(shutil.rmtree, d, True)
    with open(os.path.join(d, "python"), "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    os.chmod(os.path.join(d, "python"), 0o755)
    return d + os.pathsep + os.environ.get("PATH", "")


def sh(*args, env=None, timeout=60):
    return subprocess.run(["bash", "run_all.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PATH": this_python_first(), **(env or {})})


def grid(*args):
    """(entry names in order, {name: [seeds]}, command lines, the closing '# N runs' count) of a dry run: the
    names come from run_all.sh itself, never from a copy here."""
    p = sh("--dry-run", *args)
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stdout.splitlines() if x.startswith(("torchrun", "python"))]
    seeds = {}
    for x in lines:
        m = re.search(r"--out_dir \S+/([^/\s]+)/s(\d+)(?: |$)", x)
        assert m, x
        seeds.setdefault(m.group(1), []).append(int(m.group(2)))
    count = re.fullmatch(r"# (\d+) runs \(.*\)", p.stdout.strip().splitlines()[-1])
    assert count, p.stdout[-200:]
    return list(seeds), seeds, lines, int(count.group(1))


def test_dry_run_lists_the_whole_paper_grid():
    names, seeds, lines, count = grid()
    # the header's count is the lines printed, 5 seeds per entry but RLVMR's one cold start
    assert count == len(lines) == 5 * len(names) - 4 and seeds["rlvmr_cold"] == [0]
    assert all(seeds[n] == [0, 1, 2, 3, 4] for n in names if n != "rlvmr_cold")
    released = [x for x in lines if "/released/" in x or "/ws_released/" in x]  # the authors' launchers' presets
    own = [x for x in lines if re.search(r"/(gigpo|beacon|rlvmr)_ref/", x)]  # the references' own protocols
    assert all("--preset paper" in x for x in lines if x not in released + own) and len(released) == 10
    assert all("--preset released" in x and "--preset paper" not in x for x in released)
    assert len(own) == 15 and all(re.search(r"--preset (gigpo|beacon|rlvmr)_ref", x) for x in own)
    # the hints the paper used: the authors' expert data, ALFWorld's and WebShop's own; RLVMR's cold start fits
    # tagged trajectories (the stand-in unless TAGGED names RLVMR-format data), its RL rows start from it
    assert all("--expert_data data/sft_data/" + ("webshop" if "/ws_" in x else "alfworld") + "_sft_data.json" in x
               for x in lines if "/rlvmr_cold/" not in x)
    cold = [x for x in lines if "/rlvmr_cold/" in x][0]
    assert "--expert_data runs/paper_grid/rlvmr_standin.json --train_games 200 --steps 63 --lr 1e-5" in cold
    assert all(x.endswith("--model runs/paper_grid/rlvmr_cold/s0/ckpt_000063") for x in lines
               if re.search(r"/(rlvmr|grpo_cold|rlvmr_ref)/", x))
    assert "--expert_data my.json " in sh("--dry-run", "--only", "aux_rl", env={"TAGGED": "my.json"}).stdout
    by_group = {g: grid("--only", g)[0] for g in GROUPS}  # the --only groups split the grid, in its order
    assert sorted(sum(by_group.values(), [])) == sorted(names) and len(set(names)) == len(names)
    # every main entry runs a registered scheduler (plain GRPO is named grpo in the grid)
    from config import rule_names
    main = [x for x in lines if any(f"/{n}/s0 " in x for n in by_group["main"])]
    assert {re.search(r"--scheduler (\S+)", x).group(1) for x in main} <= set(rule_names())
    seven = sh("--dry-run", "--7b").stdout
    assert seven.count("--model Qwen/Qwen2.5-7B-Instruct --parallel fsdp") == 10
    ws = grid("--only", "webshop")[2]
    assert len(ws) == 5 * len(by_group["webshop"]) and all(  # the authors' launcher: 15 steps, mini-batches of 64
        "--env webshop --webshop_backend official --max_steps 15 --ppo_mini_batch 64 --eval_split eval" in x
        for x in ws)
    assert "no data/sft_data/alfworld_sft_data.json" in sh("--only", "main", env={"EXPERT_DATA": ""}).stderr
    assert sh("--only", "bogus").returncode == 2 and sh("--smoke").returncode == 2


def test_cpu_smoke_dry_run_one_seed_per_entry():
    names, seeds, lines, count = grid("--cpu", "--smoke")
    assert count == len(lines) == len(names) and all(seeds[n] == [0] for n in names)
    assert all("--steps 1 " in x and "--preset cpu" in x for x in lines)


def test_pick2_regime_dry_run_gives_each_method_its_seeds():
    """--cpu --only pick2: Agent-G² and GRPO with 3 seeds, four schedules with 2, enumeration and the two hint-source
    runs with 1, all under the cpu_pick2 preset, in the run directories docs/results.md names, with config.METHODS'
    flags."""
    from config import METHODS
    names, seeds, lines, count = grid("--cpu", "--only", "pick2")
    assert seeds == {"g2": [0, 1, 2], "grpo": [0, 1, 2], "fixed": [0, 1], "linear": [0, 1], "target_acc": [0, 1],
                     "binary": [0, 1], "enum": [0], "self_hints": [0], "half_hints": [0]}
    assert count == len(lines) == 17 and all(x.startswith("python train.py --preset cpu_pick2 --seed ") for x in lines)
    assert all(x.endswith(f"/s0 {METHODS[n][1]}") for n in ("self_hints", "half_hints") for x in lines if f"/{n}/" in x)
    assert all(re.search(r"--out_dir runs/cpu_pick2/\w+/s\d ", x + " ") for x in lines)
    assert sh("--only", "pick2", "--dry-run").returncode == 2  # the regime is a CPU one
    toy = grid("--cpu")[2]  # the toy grid leaves the regime out: it runs only when asked for
    assert len(toy) == 2 * len(grid("--cpu", "--smoke")[0]) and not any("cpu_pick2" in x for x in toy)


def test_mix6_regime_dry_run_gives_each_method_its_seeds():
    """--cpu --only mix6: Agent-G² and GRPO with 5 seeds; the scalar schedules, the probe, the four ablations
    (sigma = 0, uniform, K = 1, eta = 0) and Table 1's hint-free rows (GiGPO, BEACON, Agent-G² + GiGPO) with 3,
    under the cpu_mix6 preset, seed by seed, config.METHODS' flags."""
    from config import METHODS
    names, seeds, lines, count = grid("--cpu", "--only", "mix6")
    assert seeds == {"g2": [0, 1, 2, 3, 4], "grpo": [0, 1, 2, 3, 4], **{n: [0, 1, 2] for n in (
        "fixed", "linear", "target_acc", "binary", "no_sampling", "uniform", "K1", "no_aux", "gigpo", "beacon",
        "g2_gigpo", "rlvmr", "grpo_cold")}, "rlvmr_cold": [0]}
    assert count == len(lines) == 50 and all(x.startswith("python train.py --preset cpu_mix6 --seed ") for x in lines)
    aux = ("rlvmr_cold", "rlvmr", "grpo_cold")
    assert all(x.endswith(f"/s{x.split('--seed ')[1].split()[0]}" + (f" {METHODS[n][1]}" if n != "g2" else ""))
               for n in names if n not in aux for x in lines if f"/{n}/" in x)
    # Table 1's Aux-RL rows (docs/results.md §12): the same under --only aux_rl, the cold start first
    names, seeds, aux_lines, count = grid("--cpu", "--only", "aux_rl")
    assert names == list(aux) and count == 7 and aux_lines == [x for x in lines if re.search(r"/(rlvmr\w*|grpo_cold)/", x)]
    assert aux_lines[0] == ("python train.py --preset cpu_mix6 --seed 0 --out_dir runs/cpu_mix6/rlvmr_cold/s0 "
                            f"{METHODS['rlvmr_cold'][1]} --expert_data runs/cpu_mix6/rlvmr_standin.json --steps 75 "
                            "--lr 1e-3 --eval_every 0 --prompt rlvmr_compact --max_new_tokens 48")
    assert all(x.endswith(" --model runs/cpu_mix6/rlvmr_cold/s0/ckpt_000075 --prompt rlvmr_compact --max_new_tokens 48")
               and f" {METHODS[x.split('/')[2]][1]} " in x for x in aux_lines[1:])
    assert [int(x.split("--seed ")[1].split()[0]) for x in lines] == sorted(
        int(x.split("--seed ")[1].split()[0]) for x in lines)  # seed by seed
    assert sh("--only", "mix6", "--dry-run").returncode == 2


def policy_acted(run_dir):
    """The policy generated tokens in the trained step (not only the hint and the aux loss), and
    whether a policy-gradient step had a row to act on (a group with a non-zero advantage)."""
    steps = [json.loads(x) for x in open(os.path.join(run_dir, "log.jsonl")) if '"lr"' in x]
    return sum(r["tokens"] for r in steps) > 0, any(r["zero_adv_groups"] < r["groups"] for r in steps)


@pytest.mark.slow
def test_cpu_smoke_grid_gives_every_entry_its_step(tmp_path):
    p = sh("--cpu", "--smoke", env={"RUN_ROOT": str(tmp_path), "TQDM_DISABLE": "1"}, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    names = grid("--cpu", "--smoke")[0]
    from config import Config
    from scheduler import make_rule
    stats_keys = make_rule(Config(), ["a"], [3]).stats()
    for n in names:
        d = tmp_path / n / "s0"
        steps = [json.loads(x) for x in open(d / "log.jsonl") if '"eval"' not in x]
        assert [r["step"] for r in steps] == [0], n
        summary = json.load(open(d / "summary.json"))
        assert summary["steps"] == 1 and summary["cfg"]["preset"] == ("cpu_webshop" if n.startswith("ws_") else "cpu"), n
        assert summary["cfg"]["env"] == ("webshop" if n.startswith("ws_") else "alfworld"), n
        assert set(stats_keys) <= set(steps[0]), n  # train.py logs the scheduler's stats() whole
        if summary["cfg"]["mode"] not in ("sft_full", "sft_prefix"):  # SFT plays no rollout
            assert policy_acted(d)[0], (n, "the policy generated no token: the hint fills --max_steps")
    # a 2-rollout group is often all-0 or all-1, so one run may have no non-zero advantage; the grid as a whole must
    assert sum(policy_acted(tmp_path / n / "s0")[1] for n in names if not n.startswith("sft")) >= 1
    again = sh("--cpu", "--smoke", env={"RUN_ROOT": str(tmp_path)})  # complete runs are skipped: resumable
    assert again.returncode == 0 and again.stdout.count("[run_all] done already:") == len(names)
