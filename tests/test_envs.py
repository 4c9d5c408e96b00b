"""ALFWorld on the real engine: built-in games replay and win, prefix replay, generator determinism, the
pool's failure handling, and the official-data loader; the environment registry (envs.ENVS, --env
module:Class), the episode interface every environment keeps (check_episode_interface, reused by
tests/test_toy_env.py), the prompt's wording from the registry, and the warning for empty length clusters.

    python -m pytest -q tests/test_envs.py -m "not slow"
"""
import dataclasses
import filecmp
import json
import os
import shutil

import pytest

from envs import AlfEnv, EnvPool, room_text, task_text
from plumbing.gamegen import BUILTIN, TASK_TYPES, make_games, official_root
from plumbing.tasks import batch_indices, load_tasks


@pytest.fixture(scope="module")
def pool():
    p = EnvPool(2)
    yield p
    p.close()


@pytest.mark.slow
def test_every_builtin_walkthrough_wins_with_admissible_commands(pool):
    """Replays each built-in game's full walkthrough as a prefix: AlfEnv.reset raises if any command is not
    admissible, and the episode must end won."""
    tasks = [t for split in BUILTIN for t in load_tasks(split)]
    assert len(tasks) == sum(BUILTIN.values()) == 480
    assert {t["task_type"] for t in tasks} == {
        "pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
        "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place"}
    bad = []
    for i in range(0, len(tasks), 24):
        chunk = tasks[i:i + 24]
        res = pool.run([("reset", 10_000 + i + j, t["gamefile"], t["walkthrough"])
                        for j, t in enumerate(chunk)])
        bad += [(t["id"], r.get("error")) for t, r in zip(chunk, res) if not (r["ok"] and r["won"])]
        pool.run([("close", 10_000 + i + j) for j in range(len(chunk))])
    assert bad == []


def test_prefix_reset_equals_manual_steps():
    env = AlfEnv()
    for t in load_tasks("train")[:3]:
        n = t["L"] // 2
        a = env.reset(t["gamefile"], t["walkthrough"][:n])
        a = {k: (list(v) if isinstance(v, list) else v) for k, v in a.items()}
        b = env.reset(t["gamefile"])
        for act in t["walkthrough"][:n]:
            assert env.step(b, act)
        assert (a["obs"], a["admissible"], a["history"], a["won"]) == \
            (b["obs"], b["admissible"], b["history"], b["won"])
        assert [s[2] for s in a["prefix_steps"]] == t["walkthrough"][:n]
        assert task_text(b["history"][0][0]) and "Your task" not in room_text(b["history"][0][0])


PLAY = """
import hashlib, json, random, sys
import fast_downward
import textworld.envs.pddl.logic as tw_logic
translated, served, parsed = [], [], []
translate, parse = fast_downward.pddl2sas, tw_logic._parse_and_convert
def counted(*a, **k):  # the real translation, counted
    translated.append(1)
    return translate(*a, **k)
def counted_parse(*a, **k):  # the real parse of a game's grammar, counted
    parsed.append(1)
    return parse(*a, **k)
fast_downward.pddl2sas, tw_logic._parse_and_convert = counted, counted_parse
from envs import AlfEnv
from plumbing.tasks import load_tasks
env, out = AlfEnv(cache_translation=sys.argv[1] == "cached"), []
cached = fast_downward.pddl2sas  # the caches' function (plain: `counted` itself)
def seen(domain, problem, verbose=False, optimize=False):  # what TextWorld gets: the Task's type, SAS text
    r = cached(domain, problem, verbose=verbose, optimize=optimize)
    served.append([optimize, type(r[0]).__name__, hashlib.sha256(r[1].encode()).hexdigest()])
    return r
tw_logic.fast_downward.pddl2sas = seen
for i, t in enumerate(random.Random(0).sample(load_tasks("train"), 8) * 2):  # each game loaded twice
    r = random.Random(i)
    ep = env.reset(t["gamefile"], t["walkthrough"][:r.randint(0, t["L"])])
    rec = [ep["obs"], ep["admissible"]]
    for _ in range(10):
        a = r.choice(ep["admissible"] + ["go to nowhere"])
        rec += [a, env.step(ep, a), ep["obs"], ep["admissible"], ep["won"]]
    out.append(rec)
print(json.dumps({"play": out, "served": served, "translated": len(translated), "parsed": len(parsed)}))
"""


def test_engine_caches_leave_every_observation_unchanged(tmp_path):
    """The parse / translation caches and the shallow text-generation contexts (envs._cache_*,
    envs._shallow_textgen_context) patch TextWorld process-wide: a fresh process without them and one with
    them play the same 16 episodes (8 games, each loaded twice; expert prefix, then random actions) and must
    see the same text at every step, and TextWorld must get the same translations (the Task's type, both SAS
    texts); so must a process that reads the translations and grammar parses from the disk cache the first
    one wrote (computing none), and one whose cached files are corrupt (it computes them again and rewrites
    them)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sas, logic = tmp_path / "sas", tmp_path / "logic"

    def play(mode):
        p = subprocess.run([sys.executable, "-c", PLAY, mode], cwd=root, capture_output=True, text=True,
                           timeout=600, env={**os.environ, "AGENT_G2_CACHE": str(tmp_path)})
        assert p.returncode == 0, p.stderr[-2000:]
        out = json.loads(p.stdout)
        return out["play"], out["served"], out["translated"], out["parsed"]
    plain = play("plain")
    assert len(plain[0]) == 16 and sum(len(r) for r in plain[0]) == 16 * 52
    # four translations a load, in pairs: optimize False, then True (the replanner's); the second pair
    # repeats; one grammar parse a load
    assert [s[:2] for s in plain[1]] == [[False, "Task"], [True, "Task"]] * 32
    assert plain[2:] == (64, 16) and not sas.exists() and not logic.exists()
    cold = play("cached")  # computes each game's two translations and one parse once, writes them
    assert cold == (*plain[:2], 16, 8)
    files = sorted(sas.iterdir()) + sorted(logic.iterdir())
    assert len(files) == 16 + 8 and all(f.name.endswith(".pkl.z") for f in files)
    stamps = {f: f.stat().st_mtime_ns for f in files}
    assert play("cached") == (*plain[:2], 0, 0)  # reads them: nothing computed, no file rewritten
    assert {f: f.stat().st_mtime_ns for f in files} == stamps
    for f in files:
        f.write_bytes(b"not a translation")
    assert play("cached") == (*plain[:2], 16, 8)  # unreadable files: computed again and rewritten
    assert all(f.stat().st_size > 1000 for f in files)
    assert sorted(sas.iterdir()) + sorted(logic.iterdir()) == files


def procs():
    """[(pid, state, parent, session)] of every process, from /proc/<pid>/stat (the fields after the name)."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            st = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out.append((int(d), st[0], int(st[1]), int(st[3])))
    return out


def children(pid, zombie=False):
    """Child processes of pid: the live ones, or (zombie=True) the exited ones nobody reaped."""
    return [p for p, state, parent, _ in procs() if parent == pid and (state == "Z") == zombie]


def session(sid):
    """[(pid, parent)] of the live processes of session sid (one started with start_new_session leads its
    own): a pool's owner, its workers and the episodes they fork, or a trainer's whole tree."""
    return [(p, parent) for p, state, parent, s in procs() if s == sid and state != "Z"]


def sigkill_leader(proc, within):
    """SIGKILL `proc` alone (a Popen that leads its own session: no handler of its runs), wait up to `within`
    seconds for the rest of its session to end -> what was still alive then. Whatever was left is killed
    before returning: nothing outlives the test, pass or fail."""
    import time
    proc.kill()
    proc.wait()
    deadline = time.time() + within
    while session(proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    left = session(proc.pid)
    for pid, _ in left:
        os.kill(pid, 9)
    return left


def test_forked_group_plays_like_replayed_episodes():
    """fork_prefix: a group's prefix is replayed once and the other episodes are forked children; every
    episode must see what R separate replays see, step by step (the remaining walkthrough wins, a wrong action
    does not leak into a sibling), and closing the group leaves no child process behind."""
    t = next(t for t in load_tasks("train") if t["L"] >= 5)
    n, R = 2, 4
    pools = {f: EnvPool(1, {"env": "alfworld", "fork_prefix": f}) for f in (True, False)}
    try:
        got = {}
        for f, p in pools.items():
            res = [p.run([("reset", e, t["gamefile"], t["walkthrough"][:n]) for e in range(R)])]
            assert len(children(p.procs[0].pid)) == (R - 1 if f else 0)  # the fork path was taken (or not)
            for a in t["walkthrough"][n:]:  # episode 1 goes astray once; the others follow the expert
                res.append(p.run([("step", e, "go to moon 1" if e == 1 and a == t["walkthrough"][n] else a)
                                  for e in range(R)]))
            got[f] = [[(r["obs"], r["admissible"], r.get("won")) for r in step] for step in res]
            assert all(r["ok"] for step in res for r in step)
            p.run([("close", e) for e in range(R)])
            assert children(p.procs[0].pid) == [] and children(p.procs[0].pid, zombie=True) == []
        assert got[True] == got[False]
        assert [r[2] for r in got[True][-1]] == [True, False, True, True]  # episode 1 is a step behind
    finally:
        for p in pools.values():
            p.close()


def test_a_dead_forked_episode_is_one_lost_episode():
    t = next(t for t in load_tasks("train") if t["L"] >= 4)
    p = EnvPool(1, {"env": "alfworld", "fork_prefix": True})
    try:
        p.run([("reset", e, t["gamefile"], t["walkthrough"][:2]) for e in range(3)])
        kids = sorted(children(p.procs[0].pid))
        os.kill(kids[0], 9)  # the first fork serves episode 1
        res = p.run([("step", e, t["walkthrough"][2]) for e in range(3)])
        assert [r["ok"] for r in res] == [True, False, True] and "episode lost" in res[1]["error"]
        p.run([("close", e) for e in range(3)])
        assert children(p.procs[0].pid) == [] and children(p.procs[0].pid, zombie=True) == []
        assert p.restarts == 0  # the worker itself lives on
    finally:
        p.close()


def pss_mb(pids):
    """Proportional set size of these processes in MB (/proc/<pid>/smaps_rollup): shared pages split among
    their sharers, so a forked episode counts only what it copied."""
    total = 0.0
    for pid in pids:
        try:
            total += next(int(line.split()[1]) for line in open(f"/proc/{pid}/smaps_rollup")
                          if line.startswith("Pss:")) / 1024
        except (OSError, StopIteration):
            pass
    return total


def test_a_batch_far_beyond_the_worker_bound_keeps_memory_bounded():
    """A worker holds at most max_live episodes (plumbing/pool.py MAX_LIVE): 80 resets of one group against a
    bound of 8 make 8 live episodes (7 forked) and 72 one-line errors; the worker's memory grows by 8 episodes'
    worth, not 80 (an episode is ~1.5 MB on these games: 80 would add ~100 MB), and it goes on serving."""
    t = next(t for t in load_tasks("train") if t["L"] >= 4)
    p = EnvPool(1, {"env": "alfworld", "fork_prefix": True, "max_live": 8})
    try:
        p.run([("reset", 0, t["gamefile"], t["walkthrough"][:2])])
        w = p.procs[0].pid
        base = pss_mb([w])
        res = p.run([("reset", e, t["gamefile"], t["walkthrough"][:2]) for e in range(80)])
        assert [r["ok"] for r in res] == [True] * 8 + [False] * 72
        assert "holds 8 live episodes, its bound" in res[8]["error"] and "\n" not in res[8]["error"]
        assert len(children(w)) == 7
        assert pss_mb([w, *children(w)]) - base < 8 * 4.0  # 8 episodes at most 4 MB each
        steps = p.run([("step", e, t["walkthrough"][2]) for e in range(8)])
        assert all(r["ok"] for r in steps)
        p.run([("close", e) for e in range(80)])
        assert children(w) == [] and children(w, zombie=True) == []
        again = p.run([("reset", e, t["gamefile"], t["walkthrough"][:2]) for e in range(8)])
        assert all(r["ok"] for r in again) and p.restarts == 0
    finally:
        p.close()


KILLED_OWNER = """
import sys, time
sys.path.insert(0, {root!r})
from envs import EnvPool
from plumbing.gamegen import load_tasks
t = next(t for t in load_tasks("train") if t["L"] >= 4)
p = EnvPool(2, {{"env": "alfworld", "fork_prefix": True}})
p.run([("reset", e, t["gamefile"], t["walkthrough"][:2]) for e in range(4)])
p.send([("reset", e, t["gamefile"], []) for e in range(10, 210)])  # 200 new engines: ~30 s of work
print("ready", flush=True)
time.sleep(600)
"""


def test_workers_and_forked_episodes_die_with_their_owner_however_it_dies():
    """SIGKILL to the process that owns a pool (no cleanup of its own runs) in the middle of a long request
    ends its workers and the episodes they forked within seconds (die_with_parent), not when the request is
    done: nothing of it is left."""
    import subprocess
    import sys
    import time
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    owner = subprocess.Popen([sys.executable, "-c", KILLED_OWNER.format(root=root)], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        assert "ready" in (line.strip() for line in owner.stdout)  # EOF (the owner died) ends the loop
        time.sleep(1.0)  # worker 0 is replaying prefixes
        assert len(session(owner.pid)) >= 1 + 2 + 3  # the owner, 2 workers, a group's 3 forked episodes (+)
    finally:
        left = sigkill_leader(owner, 5)
    assert left == []


def test_invalid_actions_do_not_crash():
    env = AlfEnv()
    t = load_tasks("train")[0]
    ep = env.reset(t["gamefile"])
    for junk in ["", "dance", "go to moon 99", "ü🙂" * 300, "x" * 10_000, None]:
        assert env.step(ep, junk) is False
        assert ep["obs"] == "Nothing happens."
    assert env.step(ep, t["walkthrough"][0])  # still playable


def identity(task):
    """A game's task: its folder, <task type>-<object>-None-<receptacle>-<scene> (ALFRED's task id; the
    trial_* folders below it are the same task in other initial states)."""
    return os.path.basename(os.path.dirname(os.path.dirname(task["gamefile"])))


def test_held_out_games_are_never_training_games():
    """The mixed regime's held-out games (config/cpu_mix6.py: test_seen, test_unseen) share no game file, no
    game content and no task with the training games; at least 120 of them, 20 per task type, the unseen ones
    in scenes no training game uses. The SFT base's recipe (docs/cpu-demo.md) trained on the training split
    only and read neither held-out split, and the regime trains on that split."""
    import hashlib

    from config import get_config
    cfg = get_config(["--preset", "cpu_mix6"])
    held = [x for x in cfg.eval_split.split(",")]
    assert cfg.train_split == "train" and held == ["test_seen", "test_unseen"] and cfg.games == "builtin"
    train = load_tasks("train")
    tests = {sp: load_tasks(sp) for sp in held}
    digest = lambda t: hashlib.sha256(open(t["gamefile"], "rb").read()).hexdigest()  # noqa: E731
    scene = lambda t: identity(t).rsplit("-", 1)[1]  # noqa: E731
    assert len(train) == 240
    for sp, ts in tests.items():
        path = lambda ts_: {os.path.realpath(t["gamefile"]) for t in ts_}  # noqa: E731
        assert not path(ts) & path(train), sp
        assert not {digest(t) for t in ts} & {digest(t) for t in train}, sp
        assert not {identity(t) for t in ts} & {identity(t) for t in train}, sp
    assert not {scene(t) for t in tests["test_unseen"]} & {scene(t) for t in train}
    every = tests["test_seen"] + tests["test_unseen"]
    assert len(every) >= 120 and all(sum(t["task_type"] == tt for t in every) >= 20 for tt in TASK_TYPES)
    doc = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "cpu-demo.md")).read()
    recipe = doc.split("## The SFT base checkpoint")[1].split("```bash")[1].split("```")[0]
    text = "\n".join(x for x in recipe.splitlines() if not x.startswith("#")).replace("\\\n", " ")
    runs = [x.split()[2:] for x in text.splitlines() if x.startswith("python train.py")]
    assert len(runs) == 2
    for argv in runs:
        sft = get_config(argv)
        assert sft.mode == "sft_full" and sft.train_split == "train" and sft.games == "builtin"
        assert not set(sft.eval_split.split(",")) & set(held) and sft.train_games == 0


def test_generator_is_deterministic(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    ra = make_games(a, "valid_unseen", 3, seed=5, workers=1, progress=False)
    rb = make_games(b, "valid_unseen", 3, seed=5, workers=1, progress=False)
    assert [r[1:] for r in ra] == [r[1:] for r in rb]
    files = sorted(os.path.relpath(os.path.join(d, f), a) for d, _, fs in os.walk(a) for f in fs)
    assert len(files) == 9
    for f in files:
        assert filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False), f
    g = json.load(open(os.path.join(ra[0][0], "game.tw-pddl")))
    assert g["solvable"] and g["walkthrough"] and len(g["walkthrough"]) <= 15


def test_pool_survives_bad_input_and_replaces_killed_worker(pool):
    t = load_tasks("train")[0]
    res = pool.run([("reset", 1, t["gamefile"], []), ("reset", 2, t["gamefile"], ["not an expert action"]),
                    ("step", 999, "look"), ("bogus", 4)])
    assert res[0]["ok"] and not res[1]["ok"] and "not admissible" in res[1]["error"]
    assert not res[2]["ok"] and not res[3]["ok"]
    assert pool.run([("step", 1, "dance")])[0] == \
        {**pool.run([("step", 1, "dance")])[0], "ok": True, "valid": False}
    # worker 1 dies mid-batch: its episode is reported failed, worker 0's episode is unaffected
    res = pool.run([("reset", 10, t["gamefile"], []), ("crash", 11)])
    assert res[0]["ok"] and not res[1]["ok"] and "worker crashed" in res[1]["error"]
    assert pool.restarts == 1
    pool.kill_worker(0)  # killed from outside while holding episode 10
    res = pool.run([("step", 10, "look")])
    assert not res[0]["ok"] and "worker crashed" in res[0]["error"] and pool.restarts == 2
    assert pool.run([("reset", 13, t["gamefile"], [])])[0]["ok"]  # the replacement worker serves new episodes
    assert pool.run([("step", 13, t["walkthrough"][0])])[0]["valid"]


def test_pool_poll_answers_several_sends_in_flight_in_order(pool):
    """--overlap: sends in flight together; poll hands back each message's answers once, a worker's in the order
    sent, the same answers `run` gives; a worker that dies answers every message it held with an error."""
    t = load_tasks("train")[0]
    w0 = t["walkthrough"]
    pool.run([("reset", 21, t["gamefile"], []), ("reset", 22, t["gamefile"], w0[:1])])  # one game: one worker
    alone = {21: pool.run([("step", 21, w0[0])])[0], 22: pool.run([("step", 22, w0[1])])[0]}
    pool.run([("reset", 21, t["gamefile"], []), ("reset", 22, t["gamefile"], w0[:1])])
    assert pool.poll() == [] and pool.poll(wait=True) == []  # nothing in flight: nothing to wait for
    pool.send([("step", 21, w0[0])])
    pool.send([("step", 22, w0[1])])
    got = []
    for _ in range(10):  # bounded: polls that return nothing do not loop forever
        got += pool.poll(wait=True)
    assert [q for q, _ in got] == [("step", 21, w0[0]), ("step", 22, w0[1])]
    assert [r for _, r in got] == [alone[21], alone[22]] and alone[21]["ok"] and alone[21]["valid"]
    # a crash with two messages queued on that worker: both answered with the error, once
    assert pool.home[21] == pool.home[22]
    pool.send([("crash", 21)])
    pool.send([("step", 22, "look")])
    got = []
    for _ in range(10):
        got += pool.poll(wait=True)
    assert [q for q, _ in got] == [("crash", 21), ("step", 22, "look")]
    assert all(not r["ok"] and "worker crashed" in r["error"] for _, r in got)
    assert pool.poll() == [] and pool.run([("reset", 23, t["gamefile"], [])])[0]["ok"]


def test_official_loader(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="alfworld-download.*built-in"):
        official_root()
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    src = load_tasks("train")[:4]
    for i, t in enumerate(src):  # official layout: json_2.1.1/train/<task folder>/<trial>
        name = os.path.basename(os.path.dirname(os.path.dirname(t["gamefile"])))
        if i == 1:
            name = name.replace("-None-", "-Sliced-")  # skipped, as alfworld does
        dst = tmp_path / "json_2.1.1" / "train" / name / f"trial_{i}"
        shutil.copytree(os.path.dirname(t["gamefile"]), dst)
        if i == 2:  # unsolvable: skipped
            g = json.load(open(dst / "game.tw-pddl"))
            g["solvable"] = False
            json.dump(g, open(dst / "game.tw-pddl", "w"))
    got = load_tasks("train", games="official")
    assert [t["gamefile"] for t in got] == sorted(t["gamefile"] for t in got)
    assert len(got) == 2
    with pytest.raises(FileNotFoundError, match="no split 'valid_seen'"):
        load_tasks("valid_seen", games="official")


def test_the_goal_is_read_from_the_games_grammar():
    """A task dict's goal comes from its game's TextWorld grammar, the rule "task" (the sentence a reset shows:
    tests/test_eval.py checks it against reset on 8 games and 6 WebShop goals)."""
    from plumbing.gamegen import grammar_goal
    grammar = ('grammar :: """\n    {\n        "intro": [{"rhs": "-= Welcome =-\\n\\n#task#"}],\n'
               '        "task": [\n            {\n                "rhs": "Your task is to: put a \\"cool\\" '
               'plate in cabinet."\n            }\n        ],\n        "x": [{"rhs": "Your task is to: no."}]\n'
               '    }\n""";')
    assert grammar_goal(grammar) == 'put a "cool" plate in cabinet.'
    assert grammar_goal('grammar :: """{"intro": [{"rhs": "hello"}]}""";') == ""
    assert all(t["goal"] and "#" not in t["goal"] for t in load_tasks("valid_seen"))


def test_batch_indices_epochs_and_resume():
    B, N = 8, 20  # an epoch is 2.5 batches: batches straddle epoch boundaries
    seq = [i for s in range(10) for i in batch_indices(s, B, N, seed=3)]
    assert all(len(batch_indices(s, B, N, 3)) == B for s in range(10))
    for e in range(4):  # read in order, every epoch is a permutation of all tasks
        assert sorted(seq[e * N:(e + 1) * N]) == list(range(N))
    assert seq[:N] != seq[N:2 * N]  # each epoch is shuffled anew
    assert batch_indices(7, B, N, 3) == batch_indices(7, B, N, 3)  # a pure function of the step: resume-safe
    # pinned: a change to the seeding would silently give resumed (older) runs other batches
    assert batch_indices(0, B, N, 3) == [16, 12, 18, 8, 3, 13, 15, 10]
    assert batch_indices(2, B, N, 3) == [4, 7, 5, 19, 7, 17, 16, 2]  # straddles epochs 0 and 1
    assert batch_indices(0, B, N, 3) != batch_indices(0, B, N, 4)


# ---- the episode interface, for any environment (envs.Env documents it)
def check_history_pair(pair):
    assert isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(x, str) for x in pair), pair


def check_episode_keys(ep):
    """The episode dict's keys and types (envs.Env): obs, admissible, won, history, prefix_steps, task, room,
    room_short, and optional score / done."""
    assert isinstance(ep["obs"], str) and isinstance(ep["won"], bool)
    assert isinstance(ep["admissible"], list) and all(isinstance(a, str) for a in ep["admissible"])
    for key in ("task", "room", "room_short"):
        assert isinstance(ep[key], str), key
    assert ep["task"], "an episode has a task sentence"
    for pair in ep["history"]:
        check_history_pair(pair)
    for step in ep["prefix_steps"]:
        assert len(step) == 3 and isinstance(step[0], str) and isinstance(step[2], str), step
        assert isinstance(step[1], list), step  # (WebShop's search is free text: not a listed action)
    if "score" in ep:
        assert isinstance(ep["score"], float) and 0.0 <= ep["score"] <= 1.0
    if "done" in ep:
        assert isinstance(ep["done"], bool)


def check_episode_interface(env, game, prefix):
    """Reset with the expert prefix, then invalid actions (each leaves the state alone: only obs changes, the
    history records it) and one valid action: keys and types after each. Any environment's engine passes it.
    -> the episode dict."""
    ep = env.reset(game, list(prefix))
    check_episode_keys(ep)
    assert env.gamefile == game
    assert [a for _, _, a in ep["prefix_steps"]] == list(prefix) == [a for _, a in ep["history"]]
    assert [o for o, _, _ in ep["prefix_steps"]] == [o for o, _ in ep["history"]]
    state = (list(ep["admissible"]), ep["won"], ep.get("score"), ep.get("done"))
    for junk in ("", "dance on the moon", "x" * 2000, None, 7):
        before, n = ep["obs"], len(ep["history"])
        assert env.step(ep, junk) is False
        check_episode_keys(ep)
        assert (ep["admissible"], ep["won"], ep.get("score"), ep.get("done")) == state
        recorded = junk if isinstance(junk, str) else ""
        assert len(ep["history"]) == n + 1 and tuple(ep["history"][-1]) == (before, recorded)
    before, n, action = ep["obs"], len(ep["history"]), ep["admissible"][0]
    assert env.step(ep, action) is True
    check_episode_keys(ep)
    assert len(ep["history"]) == n + 1 and tuple(ep["history"][-1]) == (before, action)
    assert [a for _, _, a in ep["prefix_steps"]] == list(prefix)  # the prefix record stays as it was
    return ep


def test_alfworld_keeps_the_episode_interface():
    t = load_tasks("train")[0]
    check_episode_interface(AlfEnv(), t["gamefile"], t["walkthrough"][:2])


def test_webshop_lite_keeps_the_episode_interface():
    from plumbing.webshop import WebShopEnv, load_webshop_tasks
    spec = {"env": "webshop", "backend": "lite", "seed": 0, "products": 520, "max_steps": 15}
    t = load_webshop_tasks("train", spec, only=[1600])[0]
    ep = check_episode_interface(WebShopEnv(spec), t["gamefile"], t["walkthrough"][:2])
    assert "score" in ep and "done" in ep


# ---- the registry
def test_the_registry_gives_each_environment_its_pieces():
    from config import CHOICES, Config
    from envs import ENVS, env_class, env_spec, make_env
    from plumbing.tasks import tasks_for
    from plumbing.webshop import WebShopEnv
    assert list(CHOICES["env"]) == list(ENVS) == ["alfworld", "webshop"]  # --env's names, --help lists them
    assert env_class("alfworld") is AlfEnv and env_class("webshop") is WebShopEnv
    cfg, ws = Config(), dataclasses.replace(Config(), env="webshop")
    assert env_spec(cfg) == {"env": "alfworld", "fork_prefix": True}
    assert env_spec(ws)["env"] == "webshop" and env_spec(ws)["backend"] == "lite"
    assert tasks_for(cfg, "valid_seen") == load_tasks("valid_seen")
    assert [t["gamefile"] for t in tasks_for(ws, "test")] == list(range(500))
    assert AlfEnv.split_names(cfg) == ["train", "valid_seen", "valid_unseen", "test_seen", "test_unseen"]
    assert set(WebShopEnv.split_names(ws)) == {"train", "eval", "test", "valid_seen", "valid_unseen"}
    assert isinstance(make_env({"env": "webshop", "backend": "lite", "seed": 0, "products": 60,
                                "max_steps": 5}), WebShopEnv)
    assert AlfEnv.wording == ("a household robot in a text world", "")
    assert WebShopEnv.wording == ("a shopping agent in a web store",
                                  "For search[<query>], write the query yourself.")


def test_unknown_environments_are_one_line_errors(tmp_path, monkeypatch):
    from envs import env_class
    (tmp_path / "my_half_env.py").write_text("class Half:\n    wording = ('x', '')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, words in [("bogus", "no such environment"), ("alf world", "no such environment"),
                        ("no_such_module_xyz:Env", "cannot import 'no_such_module_xyz'"),
                        ("envs:NoSuchClass", "no class 'NoSuchClass'"),
                        ("my_half_env:Half", "Half has no method env_spec")]:
        with pytest.raises(ValueError, match=words) as e:
            env_class(name)
        assert "\n" not in str(e.value)


def test_the_prompt_takes_its_wording_from_the_registry(tmp_path, monkeypatch):
    """The full prompt's first line and tip come from the entry: ALFWorld's and WebShop's prompts are the ones
    they were before the registry (byte for byte), and a class of your own words its own agent."""
    from config import Config
    from rollout import user_message
    args = ("put a mug on desk.", "", [("o1", "a1")], "obs", ["go to desk 1", "look"], 1)
    alf = user_message(*args, Config(prompt="full"))
    assert alf == ("You are a household robot in a text world. Your task is to: put a mug on desk.\n"
                   "You have already taken 1 step(s).\nYour most recent 1 observation(s) and action(s):\n"
                   "[Observation 1] o1\n[Action 1] a1\nCurrent observation: obs\n"
                   "The actions you can take now: go to desk 1, look\n"
                   "First reason briefly inside <think> </think>, then reply with exactly one of the actions "
                   "inside <action> </action>.")
    ws = user_message(*args, Config(prompt="full", env="webshop"))
    assert ws == alf.replace("a household robot in a text world", "a shopping agent in a web store") + \
        " For search[<query>], write the query yourself."
    (tmp_path / "worded_env.py").write_text("from envs import Env\n\n\nclass Worded(Env):\n"
                                            "    wording = ('a test agent', 'Be brief.')\n"
                                            "    def reset(self, gamefile, prefix):\n        raise NotImplementedError\n\n"
                                            "    def step(self, ep, action):\n        raise NotImplementedError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    own = user_message(*args, Config(prompt="full", env="worded_env:Worded"))
    assert own.startswith("You are a test agent. Your task") and own.endswith("</action>. Be brief.")


def test_cluster_warning_names_empty_quantile_clusters():
    from plumbing.tasks import cluster_warning
    from scheduler import make_clusters
    lengths = [4, 5, 6, 6, 6, 6, 7]  # lengths 4-7, K = 3: both thresholds are 6, cluster 1 never holds a task
    assert make_clusters(lengths, 3)[1] == [6.0, 6.0]
    msg = cluster_warning(lengths, 3)
    assert msg.startswith("warning: --K 3") and "[6.0, 6.0]" in msg and "cluster(s) 1 empty" in msg
    assert "\n" not in msg
    assert "cluster(s) 1, 2 empty" in cluster_warning([5] * 8, 3)  # one length: every cluster but the first
    assert cluster_warning([4, 5, 6, 7] * 3, 3) is None  # every cluster holds tasks
    assert cluster_warning([4, 5, 6, 6, 6, 6, 7], 1) is None and cluster_warning([], 3) is None
    assert cluster_warning([None, 4, 5, 6], 3) is None  # tasks without a hint are not clustered
