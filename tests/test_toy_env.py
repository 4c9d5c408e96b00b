"""The toy environment of docs/environment.md (a key-and-door game; README "Hack it"): the doc's very block,
written to a file of its own and selected with --env key_door:KeyDoor, is all a new environment takes. Its tasks have 4-7 expert
steps that win, its engine keeps the episode interface (tests/test_envs.py check_episode_interface) in this
process and in the pool's workers, and (slow) train.py trains two steps on it with the tiny model, then
`eval.py panel` evaluates the checkpoint.

    python -m pytest -q tests/test_toy_env.py                    # with the end-to-end run (~1 min on 2 cores)
    python -m pytest -q tests/test_toy_env.py -m "not slow"
"""
import json
import os
import re
import subprocess
import sys

import pytest

from test_envs import check_episode_interface

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "key_door:KeyDoor"


def readme_block():
    """docs/environment.md's block (the Python block that opens with '# key_door.py')."""
    readme = open(os.path.join(ROOT, "docs", "environment.md")).read()
    return next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if b.startswith("# key_door.py"))


@pytest.fixture()
def toy_dir(tmp_path, monkeypatch):
    """A folder holding key_door.py, on sys.path here and on PYTHONPATH for subprocesses (the pool's workers
    import it as train.py does)."""
    d = tmp_path / "toy"
    d.mkdir()
    (d / "key_door.py").write_text(readme_block())
    monkeypatch.syspath_prepend(str(d))
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(d) + (os.pathsep + old if old else ""))
    yield d
    from envs import env_class
    env_class.cache_clear()  # the next test's key_door.py is another file
    sys.modules.pop("key_door", None)


def test_the_readme_toy_has_tasks_of_4_to_7_expert_steps_that_win(toy_dir):
    from envs import env_class
    toy = env_class(NAME)
    train, valid = toy.tasks(None, "train"), toy.tasks(None, "valid")
    assert len(train) == 12 and len(valid) == 6 and not {t["id"] for t in train} & {t["id"] for t in valid}
    assert {t["L"] for t in train} == {4, 5, 6, 7} and all(t["L"] == len(t["walkthrough"]) for t in train)
    assert len({t["task_type"] for t in train}) == 4  # a row each in the length table
    engine = toy.make_env({"env": NAME})
    for t in train + valid:
        ep = engine.reset(t["gamefile"], t["walkthrough"])
        assert ep["won"] and ep["obs"] == "The door opens: you are out.", t["id"]
        ep = engine.reset(t["gamefile"], t["walkthrough"][:-1])
        assert not ep["won"] and engine.step(ep, t["walkthrough"][-1]) and ep["won"]
    ep = engine.reset("4,2")
    assert engine.step(ep, "go east") and engine.step(ep, "go east") and engine.step(ep, "go east")
    assert engine.step(ep, "open door") and not ep["won"] and ep["obs"] == "The door is locked."


def test_the_readme_toy_keeps_the_episode_interface_here_and_in_the_pool(toy_dir):
    from envs import EnvPool, env_class
    t = env_class(NAME).tasks(None, "train")[-1]
    check_episode_interface(env_class(NAME).make_env({"env": NAME}), t["gamefile"], t["walkthrough"][:3])
    pool = EnvPool(1, {"env": NAME})  # a fresh interpreter: it imports key_door through PYTHONPATH
    try:
        res = pool.run([("reset", 1, t["gamefile"], t["walkthrough"][:-1])])[0]
        assert res["ok"] and not res["won"], res
        res = pool.run([("step", 1, "dance")])[0]
        assert res["ok"] and not res["valid"] and res["obs"] == "Nothing happens." and res["score"] == 0.0
        res = pool.run([("step", 1, t["walkthrough"][-1])])[0]
        assert res["valid"] and res["won"] and res["done"] and res["score"] == 1.0
    finally:
        pool.close()


def test_the_readme_toy_is_listed_by_envs_stats(toy_dir):
    p = subprocess.run([sys.executable, "envs.py", "stats", "--env", NAME], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "[envs] KeyDoor train: 12 tasks" in p.stdout and "[envs] KeyDoor valid: 6 tasks" in p.stdout
    assert re.search(r"6_rooms +4 +7 +7\.0 +7", p.stdout)


@pytest.mark.slow
def test_the_readme_toy_trains_and_evaluates(toy_dir, tmp_path):
    """Two training steps through the real train.py (tiny model, one env worker), then `eval.py panel` on the
    validation split with the checkpoint: the same config, the same environment, no other change."""
    out = tmp_path / "run"
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    flags = ["--env", NAME, "--eval_split", "valid", "--model", "tiny", "--steps", "2", "--batch_tasks", "2",
             "--group_size", "2", "--num_workers", "1", "--max_steps", "10", "--train_panel", "0",
             "--eval_every", "0", "--ckpt_every", "0", "--out_dir", str(out)]
    train = subprocess.run([sys.executable, "train.py", *flags], cwd=ROOT, capture_output=True, text=True,
                           timeout=600, env=env)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert "[hints] expert: 12 of 12 training tasks start with a hint" in train.stdout
    assert "6_rooms" in train.stdout  # the length table of its task types
    steps = [json.loads(x) for x in open(out / "log.jsonl") if '"lr"' in x]
    assert [r["step"] for r in steps] == [0, 1] and all(r["rollouts"] == 2 * 2 for r in steps)
    assert json.load(open(out / "config.json"))["env"] == NAME
    panel = subprocess.run([sys.executable, "eval.py", "panel", "--model", str(out / "ckpt_000002"),
                            "--split", "valid", "--num_workers", "1", "--out", str(tmp_path / "panel.json")],
                           cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert panel.returncode == 0, panel.stdout[-3000:] + panel.stderr[-3000:]
    assert "valid (every one of 6 key_door:KeyDoor tasks) | greedy" in panel.stdout
    res = json.load(open(tmp_path / "panel.json"))
    assert res["key"]["tasks"] == [t for t in res["key"]["tasks"] if t.startswith("key_door/")]
    assert len(res["key"]["tasks"]) == 6 and res["seeds"]["0"]["n"] == 6
