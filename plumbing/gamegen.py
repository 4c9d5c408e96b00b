"""ALFWorld's games: the offline generator (games in the official layout, from alfworld's own generator
pieces), the built-in set shipped in data/alfworld_builtin.tar.gz, and the loader of a split (`load_tasks`:
the built-in set or the official games in $ALFWORLD_DATA/json_2.1.1), which envs.py's ALFWorld entry serves.

Contract. load_tasks(split) -> [{"id", "gamefile", "task_type", "goal", "walkthrough", "L"}]: games the real
ALFWorld engine plays, each walkthrough the hand-coded expert's solution (a game is kept only once solved).

    python envs.py make-games --split train --n 200 --seed 0 --out DIR # ALFWorld-format games, offline
    python envs.py make-builtin                                         # rebuild data/alfworld_builtin.tar.gz
    python envs.py stats                                                # split sizes + expert lengths

ALFWorld games are written in the official layout (<split>/<task>-<obj>-None-<parent>-<scene>/trial_*/ with
initial_state.pddl, traj_data.json, game.tw-pddl). Walkthroughs come from alfworld's own generator pieces
(`add_task_to_grammar`, `is_solvable` of the `alfworld-generate` script) and its hand-coded expert, with the
expert's move/put state-tracking bug patched. Rooms come from the AI2-THOR scene layouts inside the alfworld
wheel; valid_unseen uses ALFRED's held-out scenes.
"""
import argparse
import collections
import functools
import glob
import importlib.machinery
import importlib.util
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import sys
import sysconfig
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
BUILTIN_TAR = os.path.join(HERE, "data", "alfworld_builtin.tar.gz")
# games per split in the built-in set; test_seen / test_unseen: the mixed regime's held-out games
# (config/cpu_mix6.py), generated apart from every training game's task (make_builtin: exclude)
BUILTIN = dict(train=240, valid_seen=48, valid_unseen=48, test_seen=72, test_unseen=72)
TASK_TYPES = ["pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place"]
INVALID_OBS = "Nothing happens."  # the engine's answer to an action it cannot take


def _alfworld_env():  # the alfworld package reads $ALFWORLD_DATA at import
    os.environ.setdefault("ALFWORLD_DATA", os.path.join(tempfile.gettempdir(), "alfworld_data"))


ROOMS_FOR_TASK = {"pick_and_place_simple": ["Kitchen", "LivingRoom", "Bedroom", "Bathroom"],
                  "pick_two_obj_and_place": ["Kitchen", "LivingRoom", "Bedroom", "Bathroom"],
                  "look_at_obj_in_light": ["LivingRoom", "Bedroom"],
                  "pick_clean_then_place_in_recep": ["Kitchen", "Bathroom"],
                  "pick_heat_then_place_in_recep": ["Kitchen"], "pick_cool_then_place_in_recep": ["Kitchen"]}
SCENES = {"Kitchen": range(1, 31), "LivingRoom": range(201, 231), "Bedroom": range(301, 331),
          "Bathroom": range(401, 431)}
APPLIANCE = {"pick_clean_then_place_in_recep": "SinkBasin", "pick_heat_then_place_in_recep": "Microwave",
             "pick_cool_then_place_in_recep": "Fridge"}
LAMP_HOLDERS = ["SideTable", "Desk", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand"]


# ---------------------------------------------------------------------------------------------
# Game generation (offline). One RNG stream per (seed, split, index, attempt): deterministic and
# independent of the number of worker processes.
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(None)
def _consts():
    import alfworld.gen.constants as C
    val = {r: {o for o in objs if "Sliced" not in o} for r, objs in C.VAL_RECEPTACLE_OBJECTS.items()}
    static = sorted(r for r in val if r not in set(C.MOVABLE_RECEPTACLES))
    acts = {k: {o for o in C.VAL_ACTION_OBJECTS[k] if "Sliced" not in o}
            for k in ("Cleanable", "Heatable", "Coolable")}
    placeable = {o for objs in val.values() for o in objs} - set(static)
    return dict(C=C, val=val, static=static, placeable=placeable, movable=set(C.MOVABLE_RECEPTACLES),
                openable=set(C.OPENABLE_CLASS_LIST) - {"Box"}, clean=acts["Cleanable"], heat=acts["Heatable"],
                cool=acts["Coolable"], slice=set(C.VAL_ACTION_OBJECTS["Sliceable"]),
                otypes=sorted((set(C.OBJECTS) - set(static)) | placeable
                              | {"DeskLamp", "FloorLamp", "Knife"}),
                test_scenes=set(C.TEST_SCENE_NUMBERS))


def _mangle(s):  # ALFRED id -> PDDL name (AlfredDemangler undoes it)
    for a, b in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        s = s.replace(a, b)
    return s


def _thor_id(cls, x, y, z):
    # basins carry their parent's name first: the demangler shows 'Sink|..|SinkBasin' as 'sinkbasin 1'
    head = {"SinkBasin": "Sink", "BathtubBasin": "Bathtub"}.get(cls, cls)
    tail = "|" + cls if cls in ("SinkBasin", "BathtubBasin") else ""
    return "%s|%+06.2f|%+06.2f|%+06.2f%s" % (head, x, y, z, tail)


def _room(rng, scene, room_type, need, min_r, max_r):
    """Receptacles of an AI2-THOR scene (ids, poses from the layout files), subsampled to a room size,
    each at its own location (two receptacles at one location confuse the expert)."""
    import alfworld
    import numpy as np
    K = _consts()
    base = os.path.join(os.path.dirname(alfworld.__file__), "gen", "layouts", "FloorPlan%d" % scene)
    openable = json.load(open(base + "-openable.json"))
    scene_objs = json.load(open(base + "-objects.json"))
    grid = [tuple(p) for p in np.load(base + "-layout.npy").tolist()]
    recs = []
    for rid in sorted(openable):
        head = rid.split("|")[0]
        rtype = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}.get(head, head)
        if rtype in K["static"]:
            recs.append({"id": rid if head not in ("Sink", "Bathtub") else None, "type": rtype,
                         "pose": openable[rid]})
    have = collections.Counter(r["type"] for r in recs)
    present = set(scene_objs) | {"SinkBasin" for o in scene_objs if o == "Sink"} | \
        {"BathtubBasin" for o in scene_objs if o == "Bathtub"}
    for rtype in sorted(present | need):  # types the layout file lacks (burners, toilet, ...)
        if rtype in K["static"] and have[rtype] == 0:
            recs += [{"id": None, "type": rtype, "pose": None} for _ in range(rng.randint(1, 2))]
    rng.shuffle(recs)
    target = rng.randint(min_r, max_r)
    while len(recs) > target:  # drop duplicates of the most frequent type first, keep what the task needs
        cnt = collections.Counter(r["type"] for r in recs)
        drop = [r for r in recs if cnt[r["type"]] > 1 or r["type"] not in need]
        if not drop:
            break
        top = max(cnt[r["type"]] for r in drop)
        recs.remove(next(r for r in drop if cnt[r["type"]] == top))
    ids, used = set(), set()
    for r in recs:
        while r["id"] is None or r["id"] in ids:
            x, z = rng.choice(grid)
            r["id"] = _thor_id(r["type"], x + rng.uniform(-.6, .6), rng.uniform(0, 2),
                               z + rng.uniform(-.6, .6))
        ids.add(r["id"])
    recs.sort(key=lambda r: r["id"])
    for r in recs + [None]:  # last: the agent's start, which must hold no receptacle
        for t in range(1000):
            if r is not None and r["pose"] is not None and t < 8:  # the real interaction pose first
                x, z, rot, hor = r["pose"]
                c = (round(x / .25), round(z / .25), round(rot / 90) % 4,
                     int(hor) + rng.choice([0, 15, 30, -15]))
            else:
                x, z = rng.choice(grid)
                c = (round(x / .25), round(z / .25), rng.randrange(4), rng.choice([30, 0, 15, 45]))
            loc = _mangle("loc|%d|%d|%d|%d" % c)
            if loc not in used:
                used.add(loc)
                break
        if r is None:
            return recs, loc, sorted(o for o in scene_objs if o in K["placeable"] or o == "DeskLamp")
        r["loc"] = loc


def _sample_game(rng, split, task_type, args):
    """One candidate game: (folder name, initial_state.pddl text, traj_data dict) or None."""
    K = _consts()
    scenes = [(s, rt) for rt in ROOMS_FOR_TASK[task_type] for s in SCENES[rt]
              if (s in K["test_scenes"]) == split.endswith("unseen")]
    scene, room_type = rng.choice(scenes)
    app = APPLIANCE.get(task_type)
    # the task: object, parent receptacle (or lamp), with every type it needs present in the room
    import alfworld  # noqa: F401
    pool = json.load(open(os.path.join(os.path.dirname(sys.modules["alfworld"].__file__), "gen", "layouts",
                                       "FloorPlan%d-objects.json" % scene)))
    rtypes = K["static"]
    objs = [o for o in pool if o in K["placeable"]
            and (not app or o in K[{"SinkBasin": "clean", "Microwave": "heat", "Fridge": "cool"}[app]])]
    if not objs:
        return None
    obj = rng.choice(sorted(objs))
    holders = sorted(r for r in rtypes if obj in K["val"].get(r, ()))
    if task_type == "look_at_obj_in_light":
        if "DeskLamp" not in pool:
            return None
        parent, toggle = "", "DeskLamp"
        need = {rng.choice(LAMP_HOLDERS)}
    else:
        parents = [p for p in holders if p != app and any(h not in (p, "Fridge" if app == "Fridge" else p)
                                                          for h in holders)]
        if not parents:
            return None
        parent, toggle = rng.choice(parents), ""
        need = {parent} | ({app} if app else set())
    recs, agent_loc, pool = _room(rng, scene, room_type, need, args.min_receptacles, args.max_receptacles)
    by_type = collections.defaultdict(list)
    for r in recs:
        by_type[r["type"]].append(r)
    if not need <= set(by_type):
        return None
    objects, load = [], collections.Counter()

    def place(otype, types):
        cands = [r for t in types for r in by_type.get(t, []) if load[r["id"]] < 6]
        if not cands:
            return False
        r = rng.choice(cands)
        x, y, z = (float(v) for v in r["id"].split("|")[1:4])
        oid = _thor_id(otype, x + rng.uniform(-.4, .4), y + rng.uniform(0, .3), z + rng.uniform(-.4, .4))
        load[r["id"]] += 1
        objects.append({"id": oid, "type": otype, "recep": r})
        return True

    start = [t for t in by_type
             if obj in K["val"].get(t, ()) and t != parent and not (app == "Fridge" and t == "Fridge")]
    surfaces = [t for t in start if t not in K["openable"]]
    n_target = rng.randint(2, 3) if task_type == "pick_two_obj_and_place" else rng.choice([1, 1, 1, 2, 2, 3])
    for _ in range(n_target):  # most ALFRED objects start on open surfaces: keeps expert searches realistic
        place(obj, surfaces if surfaces and rng.random() < args.surface_bias else start)
    if sum(o["type"] == obj for o in objects) < (2 if task_type == "pick_two_obj_and_place" else 1):
        return None
    lamp_at = [t for t in LAMP_HOLDERS if t in by_type]
    if ("DeskLamp" in pool or toggle) and lamp_at and not place("DeskLamp", lamp_at) and toggle:
        return None
    if toggle and not any(o["type"] == "DeskLamp" for o in objects):
        return None
    distract = [o for o in pool if o in K["placeable"] and o != obj]
    rng.shuffle(distract)
    for otype in distract[:rng.randint(args.min_distractors, args.max_distractors)]:
        for _ in range(rng.choice([1, 1, 2, 3])):
            place(otype, [t for t in by_type if otype in K["val"].get(t, ())])
    return (f"{task_type}-{obj}-None-{parent or toggle}-{scene}",
            _problem_pddl(recs, objects, agent_loc, task_type, obj, parent, toggle),
            {"task_type": task_type, "scene": {"scene_num": scene, "room_type": room_type},
             "pddl_params": {"object_target": obj, "parent_target": parent, "toggle_target": toggle,
                             "mrecep_target": "", "object_sliced": False},
             "turk_annotations": {"anns": [{"task_desc": _describe(task_type, obj, parent, toggle)}]}})


def _problem_pddl(recs, objects, agent_loc, task_type, obj, parent, toggle):
    import alfworld.gen.goal_library as glib
    K = _consts()
    m = _mangle
    L = ["(define (problem plan_synthetic)", "(:domain alfred)", "(:objects", "agent1 - agent"]
    L += ["%sType - otype" % t for t in K["otypes"]] + ["%sType - rtype" % t for t in K["static"]]
    L += ["%s - object" % m(o["id"]) for o in sorted(objects, key=lambda o: o["id"])]
    L += ["%s - receptacle" % m(r["id"]) for r in recs]
    L += ["%s - location" % loc for loc in sorted({r["loc"] for r in recs} | {agent_loc})] + [")", "(:init"]
    L += ["(receptacleType %s %sType)" % (m(r["id"]), r["type"]) for r in recs]
    L += ["(objectType %s %sType)" % (m(o["id"]), o["type"]) for o in objects]
    otypes = sorted({o["type"] for o in objects})
    # PutObject needs canContain facts; without them the goal is unreachable (the KeyError 'val1' crash)
    L += ["(canContain %sType %sType)" % (rt, ot) for rt in sorted({r["type"] for r in recs}) for ot in otypes
          if ot in K["val"].get(rt, ())]
    for pred, ok in (("pickupable", K["placeable"]), ("isReceptacleObject", K["movable"]),
                     ("cleanable", K["clean"]), ("heatable", K["heat"]), ("coolable", K["cool"]),
                     ("toggleable", {"DeskLamp"}), ("sliceable", K["slice"])):
        L += ["(%s %s)" % (pred, m(o["id"])) for o in objects if o["type"] in ok]
    L += ["(openable %s)" % m(r["id"]) for r in recs if r["type"] in K["openable"]]
    L += ["(atLocation agent1 %s)" % agent_loc]
    L += ["(inReceptacle %s %s)" % (m(o["id"]), m(o["recep"]["id"])) for o in objects]
    L += ["(receptacleAtLocation %s %s)" % (m(r["id"]), r["loc"]) for r in recs]
    L += ["(objectAtLocation %s %s)" % (m(o["id"]), o["recep"]["loc"]) for o in objects] + [")"]
    goal = glib.gdict[task_type]["pddl"].format(obj=obj, recep=parent, toggle=toggle, mrecep="")
    return "\n".join(L) + "\n" + goal.replace("#", "-") + "\n"  # goal_library writes '#' for PDDL's '-'


def _describe(task_type, obj, parent, toggle):
    o, p = obj.lower(), parent.lower()
    return {"pick_and_place_simple": f"Put a {o} in the {p}.",
            "look_at_obj_in_light": f"Look at a {o} under the lamp.",
            "pick_clean_then_place_in_recep": f"Clean a {o} and put it in the {p}.",
            "pick_heat_then_place_in_recep": f"Heat a {o} and put it in the {p}.",
            "pick_cool_then_place_in_recep": f"Cool a {o} and put it in the {p}.",
            "pick_two_obj_and_place": f"Put two {o}s in the {p}."}[task_type]


@functools.lru_cache(None)
def _generate_script():
    """alfworld-generate is a script, not a module: load its gen pieces (the __main__ block does not run)."""
    path = os.path.join(sysconfig.get_path("scripts"), "alfworld-generate")
    if not os.path.exists(path):
        path = os.path.join(os.path.dirname(sys.executable), "alfworld-generate")
    loader = importlib.machinery.SourceFileLoader("alfworld_generate_script", path)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    return mod


def patch_expert():
    """alfworld 0.4.2: the grammar says 'move X to Y' but the expert's state tracker only knows 'put', so
    after a move it still believes it holds the object (pick_two then loops). Rewrite for the tracker only."""
    from alfworld.agents.expert import handcoded_expert as he
    orig = he.BasePolicy.update_state_tracking
    if getattr(orig, "_g2_fix", False):
        return

    def update_state_tracking(self, game_state, last_action):
        if last_action.startswith("move ") and INVALID_OBS not in game_state["feedback"]:
            last_action = "put " + last_action[5:]
        return orig(self, game_state, last_action)
    update_state_tracking._g2_fix = True
    he.BasePolicy.update_state_tracking = update_state_tracking


_GEN = {}


def _gen_one(job):
    """Worker: generate game `index` of a split, re-sampling until the expert solves it within max_len."""
    index, split, seed, out, args = job
    _alfworld_env()
    patch_expert()
    if "env" not in _GEN:  # one expert env per process (each PddlEnv pins 34 MB)
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos
        from textworld.envs import PddlEnv
        env = PddlEnv(textworld.EnvInfos(admissible_commands=True, extras=["gamefile"]))
        _GEN["env"] = AlfredExpert(AlfredInfos(AlfredDemangler(env, shuffle=False)), expert_type="handcoded")
    gen = _generate_script()
    task_type = args.task_types[index % len(args.task_types)]
    import alfworld
    base = os.path.join(os.path.dirname(alfworld.__file__), "data")
    rejected = 0
    for attempt in range(500):
        rng = random.Random(f"{seed}/{split}/{index}/{attempt}")
        cand = _sample_game(rng, split, task_type, args)
        if cand is None:
            continue
        folder, pddl, traj = cand
        if folder in args.exclude:  # a held-out split never repeats a training game's task (its folder name)
            rejected += 1
            continue
        trial = "trial_T%04d_%05d_%03d" % (seed, index, attempt)
        tmp = tempfile.mkdtemp(prefix="g2gen-")
        try:
            for name, text in (("initial_state.pddl", pddl), ("traj_data.json", json.dumps(traj, indent=1))):
                open(os.path.join(tmp, name), "w").write(text)
            # add_task_to_grammar and the expert use `random`
            random.seed(f"{seed}/{split}/{index}/{attempt}/goal")
            grammar = gen.add_task_to_grammar(open(os.path.join(base, "alfred.twl2")).read(), traj,
                                              goal_desc_human_anns_prob=0.0, rng=rng)
            game = {"pddl_domain": open(os.path.join(base, "alfred.pddl")).read(), "grammar": grammar,
                    "pddl_problem": pddl, "solvable": None, "walkthrough": None}
            gpath = os.path.join(tmp, "game.tw-pddl")
            json.dump(game, open(gpath, "w"))
            walk, _err = gen.is_solvable(_GEN["env"], gpath)
            if walk is None or len(walk) > args.max_len:
                rejected += 1
                continue
            game.update(solvable=True, walkthrough=walk)
            json.dump(game, open(gpath, "w"))
            dst = os.path.join(out, split, folder, trial)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(tmp, dst)
            return dst, len(walk), task_type, rejected
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"could not generate a solvable {task_type} game (index {index})")


def make_games(out, split, n, seed=0, workers=2, max_len=15, min_receptacles=6, max_receptacles=12,
               surface_bias=0.7, min_distractors=4, max_distractors=10, task_types=TASK_TYPES, progress=True,
               exclude=()):
    """Write n solvable games of a split under out/<split>; returns [(dir, L, task_type, rejected)].
    exclude: task folder names (<task>-<obj>-None-<parent>-<scene>) the split must not contain."""
    from tqdm import tqdm
    args = argparse.Namespace(max_len=max_len, min_receptacles=min_receptacles,
                              max_receptacles=max_receptacles, surface_bias=surface_bias,
                              min_distractors=min_distractors, max_distractors=max_distractors,
                              task_types=list(task_types), exclude=frozenset(exclude))
    jobs = [(i, split, seed, out, args) for i in range(n)]
    with mp.get_context("spawn").Pool(workers, maxtasksperchild=40) as pool:
        res = list(tqdm(pool.imap(_gen_one, jobs), total=n, desc=f"make-games {split}", disable=not progress))
    return res


def make_builtin(seed=0):
    """Regenerate the shipped game set (deterministic for the seed and package versions in the manifest)."""
    from importlib.metadata import version
    tmp = tempfile.mkdtemp(prefix="g2builtin-")
    t0 = time.time()
    train_tasks = set()  # the training games' task folders: the test splits exclude them
    for i, (split, n) in enumerate(BUILTIN.items()):
        res = make_games(tmp, split, n, seed + i, exclude=train_tasks if split.startswith("test_") else ())
        if split == "train":
            train_tasks = {os.path.basename(os.path.dirname(d)) for d, _, _, _ in res}
        print(f"{split}: {len(res)} games, {sum(r[3] for r in res)} draws re-sampled")
        print(length_table([{"task_type": tt, "L": L} for _, L, tt, _ in res]))
    manifest = {"seeds": {s: seed + i for i, s in enumerate(BUILTIN)}, "games": BUILTIN, "max_len": 15,
                "receptacles": [6, 12], "surface_bias": 0.7, "generator": "envs.py make-builtin",
                "versions": {p: version(p) for p in ("alfworld", "textworld", "fast-downward-textworld")}}
    json.dump(manifest, open(os.path.join(tmp, "manifest.json"), "w"), indent=1, sort_keys=True)
    os.makedirs(os.path.dirname(BUILTIN_TAR), exist_ok=True)
    with tarfile.open(BUILTIN_TAR, "w:gz") as tf:  # sorted, fixed mtimes: byte-stable archive contents
        for root, dirs, files in sorted(os.walk(tmp)):
            dirs.sort()
            for f in sorted(files):
                p = os.path.join(root, f)
                info = tf.gettarinfo(p, os.path.relpath(p, tmp))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                tf.addfile(info, open(p, "rb"))
    shutil.rmtree(tmp)
    print(f"wrote {BUILTIN_TAR} ({os.path.getsize(BUILTIN_TAR) / 1e6:.1f} MB) in {time.time() - t0:.0f}s")


# ---------------------------------------------------------------------------------------------
# Loading a split: the built-in set (the shipped tarball, extracted to the cache once) or the official games.
# ---------------------------------------------------------------------------------------------
def default_cache():
    """$AGENT_G2_CACHE or ~/.cache/agent_g2 (created): where the built-in games are extracted when the run
    names no --cache_dir (config.cache_dir gives the same directory)."""
    d = os.environ.get("AGENT_G2_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "agent_g2")
    os.makedirs(d, exist_ok=True)
    return d


def official_root():
    """$ALFWORLD_DATA/json_2.1.1, the official games (alfworld-download), or a
    one-paragraph FileNotFoundError."""
    data = os.environ.get("ALFWORLD_DATA", "")
    root = os.path.join(data, "json_2.1.1")
    if not data or not os.path.isdir(root):
        raise FileNotFoundError(
            "official ALFWorld data not found at $ALFWORLD_DATA/json_2.1.1 "
            f"({root if data else 'ALFWORLD_DATA is unset'}). "
            "Either download it on a machine with internet (`pip install alfworld && alfworld-download`, "
            "then export ALFWORLD_DATA=<that dir>), or use the built-in generated games (--games builtin).")
    return root


def builtin_root(cache):
    root = os.path.join(cache, "alfworld_builtin")
    manifest = os.path.join(root, "manifest.json")
    with tarfile.open(BUILTIN_TAR) as tf:
        want = json.load(tf.extractfile("manifest.json"))
        if os.path.exists(manifest) and json.load(open(manifest)) == want:
            return root
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=cache)
        tf.extractall(tmp, filter="data") if sys.version_info >= (3, 12) else tf.extractall(tmp)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return root


def task_text(intro):
    """'Your task is to: put a hot apple in fridge.' -> 'put a hot apple in fridge.'"""
    i = intro.find("Your task is to:")
    return intro[i + len("Your task is to:"):].strip() if i >= 0 else ""


def grammar_goal(grammar):
    """The goal a game states, read from its TextWorld grammar (game.tw-pddl's "grammar": the rule "task",
    whose one rhs the intro shows as 'Your task is to: put a cool plate in cabinet.') -> 'put a cool plate in
    cabinet.', the text a reset shows (task_text); '' when the grammar has no such rule."""
    m = re.search(r'"task":\s*\[\s*\{\s*"rhs":\s*"((?:[^"\\]|\\.)*)"', grammar)
    return task_text(json.loads(f'"{m.group(1)}"')) if m else ""


def load_tasks(split, games="builtin", cache=None, task_types=None, verbose=False, keep_unhinted=False):
    """Sorted, deterministic list of tasks: {id, gamefile, task_type, goal, walkthrough, L}. Skips unsolvable,
    'movable' and 'Sliced' games, as alfworld does. A solvable game without a walkthrough is kept with
    walkthrough [] and L 0 when keep_unhinted (a self hint source can hint it later), else refused."""
    root = builtin_root(cache or default_cache()) if games == "builtin" else official_root()
    split_dir = os.path.join(root, split)
    if not os.path.isdir(split_dir):
        raise FileNotFoundError(f"no split '{split}' under {root} (have: {sorted(os.listdir(root))})")
    tasks, unhinted = [], []
    for gf in sorted(glob.glob(os.path.join(split_dir, "**", "game.tw-pddl"), recursive=True)):
        d = os.path.dirname(gf)
        if "movable" in d or "Sliced" in d:
            continue
        g = json.load(open(gf))
        if not g.get("solvable"):
            continue
        tt = json.load(open(os.path.join(d, "traj_data.json")))["task_type"]
        if task_types and tt not in task_types:
            continue
        walk = g.get("walkthrough") or []
        if not walk:
            unhinted.append(os.path.relpath(d, root))
        tasks.append({"id": os.path.relpath(d, root), "gamefile": gf, "task_type": tt,
                      "goal": grammar_goal(g["grammar"]), "walkthrough": walk, "L": len(walk)})
    if unhinted and not keep_unhinted:
        raise ValueError(f"{games} {split}: {len(unhinted)} games without a walkthrough "
                         f"(e.g. {unhinted[0]}); the expert hint source has nothing to replay for them. "
                         "Use --hint_source self or mixed to keep them (hinted by the policy's own wins), "
                         "or remove them.")
    if verbose:
        print(f"[envs] {games} {split}: {len(tasks)} games from {split_dir}")
    return tasks


def length_table(tasks):
    """Expert-length distribution per task type (min / mean / max, n) over the tasks with a walkthrough;
    ALFWorld's task types first, then any other environment's, sorted."""
    tasks = [t for t in tasks if t["L"]]
    by = collections.defaultdict(list)
    for t in tasks:
        by[t["task_type"]].append(t["L"])
    rows = [f"{'task type':32s} {'n':>4s} {'min':>4s} {'mean':>5s} {'max':>4s}"]
    for tt in [t for t in TASK_TYPES if t in by] + sorted(set(by) - set(TASK_TYPES)) + ["all"]:
        L = [t["L"] for t in tasks] if tt == "all" else by[tt]
        if L:
            rows.append(f"{tt:32s} {len(L):4d} {min(L):4d} {sum(L) / len(L):5.1f} {max(L):4d}")
    return "\n".join(rows)
