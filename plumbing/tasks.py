"""The tasks: what each split holds (ALFWorld games, WebShop goals), their expert trajectories, the batch
order.

    tasks = tasks_for(cfg, "train")   # [{"id", "gamefile", "task_type", "walkthrough", "L"(, "thinks")}]
    # the step's |B| tasks: a pure function of the step (resume)
    idx = batch_indices(step, B, len(tasks), seed)
    python envs.py stats              # split sizes + expert lengths (length_table)

ALFWorld's built-in games ship in data/alfworld_builtin.tar.gz (extracted to the cache once) and the official
ones are read from $ALFWORLD_DATA/json_2.1.1. A task's "walkthrough" is its expert trajectory: the game's own,
or the authors' expert data where --expert_data has an entry (hints.py); WebShop's come from that data or the
scripted expert (webshop.py).
"""
import collections
import glob
import json
import os
import shutil
import sys
import tarfile
import tempfile

import numpy as np

from hints import attach_expert_data, read_expert_file
from plumbing.webshop import (WEBSHOP_SPLITS, WebShopEnv, goal_target_key, scripted_expert, webshop_spec,
                     webshop_split_indices)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
BUILTIN_TAR = os.path.join(HERE, "data", "alfworld_builtin.tar.gz")
BUILTIN = dict(train=240, valid_seen=48, valid_unseen=48)  # games per split in the built-in set
TASK_TYPES = ["pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place"]


def tasks_for(cfg, split, verbose=False):
    """The tasks of a split for the configured environment (ALFWorld games or WebShop goals). The training
    split's expert trajectories come from --expert_data where it has an entry (hints.py), else from each
    task's own."""
    if cfg.env == "webshop":
        return load_webshop_tasks(split, webshop_spec(cfg), cfg.cache_dir or None, cfg.expert_data, verbose)
    task_types = cfg.task_types.split(",") if cfg.task_types else None
    tasks = load_tasks(split, cfg.games, cfg.cache_dir or None, task_types, verbose,
                       keep_unhinted=cfg.hint_source != "expert")
    if cfg.expert_data and split == cfg.train_split:
        tasks, note = attach_expert_data(tasks, read_expert_file(cfg.expert_data), "alfworld")
        if verbose:
            print(note)
    return tasks


def train_subset(tasks, n):
    """--train_games: a fixed seeded subset of n tasks (all when n = 0), in split order; balanced over task
    types in expectation. The same subset in train.py and eval.py."""
    return [tasks[i] for i in sorted(np.random.default_rng(1234).permutation(len(tasks))[:n])] if n else tasks


def batch_indices(step, B, N, seed):
    """|B| task indices of a training step: epoch-wise permutations of the N tasks seeded by (seed, epoch),
    read in order across epoch boundaries. A pure function of the step, so a resumed run sees the same
    batches."""
    idx, epoch = [], (step * B) // N
    while len(idx) < B:
        perm = np.random.default_rng([seed, epoch]).permutation(N)
        start = (step * B + len(idx)) - epoch * N
        idx += perm[start:start + B - len(idx)].tolist()
        epoch += 1
    return idx


# ---- ALFWorld: the built-in set (shipped tarball, extracted to the cache) or the official data
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


def load_tasks(split, games="builtin", cache=None, task_types=None, verbose=False, keep_unhinted=False):
    """Sorted, deterministic list of tasks: {id, gamefile, task_type, walkthrough, L}. Skips unsolvable,
    'movable' and 'Sliced' games, as alfworld does. A solvable game without a walkthrough is kept with
    walkthrough [] and L 0 when keep_unhinted (a self hint source can hint it later), else refused."""
    from config import cache_dir, official_root
    root = builtin_root(cache or cache_dir()) if games == "builtin" else official_root()
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
                      "walkthrough": walk, "L": len(walk)})
    if unhinted and not keep_unhinted:
        raise ValueError(f"{games} {split}: {len(unhinted)} games without a walkthrough "
                         f"(e.g. {unhinted[0]}); the expert hint source has nothing to replay for them. "
                         "Use --hint_source self or mixed to keep them (hinted by the policy's own wins), "
                         "or remove them.")
    if verbose:
        print(f"[envs] {games} {split}: {len(tasks)} games from {split_dir}")
    return tasks


def length_table(tasks):
    """Expert-length distribution per task type (min / mean / max, n) over the tasks with a walkthrough."""
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


# ---- WebShop: goals of a split, hinted by the expert data or the scripted expert
def load_webshop_tasks(split, spec, cache=None, expert_data="", verbose=False, only=None):
    """Tasks of a WebShop split (webshop_split_indices under spec['split'], paper by default: the goal-index
    ranges of WEBSHOP_SPLITS; ALFWorld's valid_* names mean 'eval').
    gamefile = the goal index. Evaluation splits keep every goal of their range (hint-free evaluation needs no
    walkthrough). The train split keeps the goals with a hint: the authors' expert entry of the goal's target
    key (expert_data, hints.py; with its thinks), else a reward-1 walkthrough of the scripted expert (for the
    official backend cached under `cache`, failures included, keyed by the goal list, since playing ~10k goals
    takes a while). only: a subset of goal indices to keep (a seeded sample, e.g. the contract test on a real
    install)."""
    import hashlib
    from config import cache_dir
    name = {"valid_seen": "eval", "valid_unseen": "eval"}.get(split, split)
    if name not in WEBSHOP_SPLITS:
        raise ValueError(f"WebShop split {split!r}: expected one of {sorted(WEBSHOP_SPLITS)}")
    env = WebShopEnv({**spec, "max_steps": 10**6})  # the expert is not bound by the episode step limit
    idx = webshop_split_indices(env.goals, name, spec.get("split", "paper"))
    lo, hi = WEBSHOP_SPLITS[name]
    if only is not None:
        keep = set(only)
        idx = [i for i in idx if i in keep]
    if not idx:
        raise ValueError(f"WebShop {spec['backend']}: {len(env.goals)} goals, "
                         f"none in split {name} {lo}..{hi}")
    walks, path = {}, None
    if spec["backend"] == "official" and name == "train":
        goals_json = json.dumps([(g["asin"], g["instruction_text"]) for g in env.goals])
        key = hashlib.sha1(goals_json.encode()).hexdigest()
        path = os.path.join(cache or cache_dir(), f"webshop_official_experts_{key[:12]}.json")
        walks = {**({int(k): v for k, v in json.load(open(path)).items()} if os.path.exists(path) else {}),
                 **walks}
    experts = {}
    # the goals an entry matches keep it; the others get the scripted expert
    if expert_data and name == "train":
        matched, note = attach_expert_data([{"gamefile": i, "walkthrough": None} for i in idx],
                                           read_expert_file(expert_data), "webshop",
                                           key_of=lambda t: goal_target_key(env.goals[t["gamefile"]]))
        experts = {t["gamefile"]: t for t in matched if t["walkthrough"] is not None}
        if verbose:
            print(note)
    tasks = []
    for i in idx:
        if i in experts:
            tasks.append({"id": f"webshop-{spec['backend']}/{i}", "gamefile": i,
                          "task_type": env.goals[i].get("category", "webshop"),
                          "walkthrough": experts[i]["walkthrough"],
                          "thinks": experts[i]["thinks"], "L": experts[i]["L"]})
            continue
        if name == "train" and i not in walks:
            try:
                walk, score = scripted_expert(env, i)
            except RuntimeError:  # the target never showed up in the results
                walk, score = None, 0.0
            walks[i] = walk if score == 1.0 else None
        walk = walks.get(i) or []
        if name == "train" and not walk:
            continue  # no reward-1 demonstration: no hints to give
        g = env.goals[i]
        tasks.append({"id": f"webshop-{spec['backend']}/{i}", "gamefile": i,
                      "task_type": g.get("category", "webshop"), "walkthrough": walk, "L": len(walk)})
    if path:  # atomic: every rank writes the same content
        json.dump(walks, open(path + f".{os.getpid()}", "w"))
        os.replace(path + f".{os.getpid()}", path)
    if verbose:
        print(f"[envs] webshop-{spec['backend']} {name}: {len(tasks)} goals (indices {idx[0]}..{idx[-1]})")
    return tasks
