"""Where the hints come from: every replayed prefix comes from one interface, a hint source.

    source = make_source(cfg, train_tasks)           # --hint_source expert|self|mixed, --drop_walkthroughs F
    source.hint(task) -> (actions, thinks) | None    # what to replay the first n steps of; L = len(actions)
    source.observe(episodes) -> task ids             # it learns from the played episodes: whose hint changed
    source.state_dict() / source.load_state_dict(sd) # saved with every checkpoint (train.py's run state)
    group(source, task, n, R) -> a rollout group     # {"task", "n", "R", "prefix": the n actions, "thinks"}

Two sources ship. `ExpertSource`: the tasks' expert trajectories, i.e. the games' walkthroughs, or the
authors' expert data where --expert_data has an entry (read below, with its thinks). `SelfSource`: the
shortest winning trajectory the policy itself has played for the task, valid actions only, the replayed prefix
included (an invalid action leaves the state as it was, so skipping it replays the same episode). A task with
no hint yet is played at depth 0, and its group does not move the scheduler's statistics (train.py). A new
source is one file of your own: a class with these four methods, built as Class(cfg, tasks), selected with
--hint_source my_file:MyClass (make_source imports it; README "Hack it" has one).

The authors' file is {"trajectories": [{"id", "task_type", "actions", "think"}, ...]}: 3,553 ALFWorld entries,
one per training game, each step with an LLM-written think. Their actions need not be the game's walkthrough
(several search shelf after shelf before they take the object): the hints the paper used are these. An
ALFWorld entry is matched to its game by the game's trial folder (trial_T..., the entry id's tail); a WebShop
entry by its target key (ASIN and option values). A task with an entry replays its actions (L = their number)
and its aux / SFT targets carry the thinks; a task without one keeps its own walkthrough, counted in the
start-up log.
"""
import collections
import json
import os
import re

import numpy as np


def read_expert_file(path):
    """The entries of an expert file, read as the authors' loader reads them: actions stripped and empty ones
    dropped, each think kept beside its action ("" where the list runs short) [ZJU-REAL/Agent-G2
    gmsv/alfworld.py, GMSVAlfworldPrefixRuntime._load_expert_store].
    -> [{"id", "actions", "thinks"}]; a malformed entry raises ValueError naming it."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"--expert_data {path}: no such file "
                                "(the authors' sft_data/alfworld_sft_data.json or "
                                "webshop_sft_data.json, from their repository or their Hugging Face dataset "
                                "xiamoent/Agent-G2-ALFWorld-Webshop-sft-data)")
    payload = json.load(open(path, encoding="utf-8"))
    items = payload.get("trajectories") if isinstance(payload, dict) else payload
    if not isinstance(items, list):
        raise ValueError(f"--expert_data {path}: expected {{\"trajectories\": [...]}} or a list of entries")
    out = []
    for k, item in enumerate(items):
        name = f"--expert_data {path}: entry {k}" + (f" ({item['id']!r})"
                                                      if isinstance(item, dict) and "id" in item else "")
        if not isinstance(item, dict) or "id" not in item:
            raise ValueError(f"{name}: not an object with an \"id\"")
        actions, thinks = item.get("actions"), item.get("think", [])
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise ValueError(f"{name}: \"actions\" must be a list of strings")
        if not isinstance(thinks, list):
            raise ValueError(f"{name}: \"think\" must be a list of strings")
        kept = [(a.strip(), str(thinks[j]).strip() if j < len(thinks) else "") for j, a in enumerate(actions)
                if a.strip()]
        if not kept:
            raise ValueError(f"{name}: no action")
        out.append({"id": str(item["id"]), "actions": [a for a, _ in kept],  # a missing think is ""
                    "thinks": [t for _, t in kept] if thinks else []})
    return out


def trial_aliases(entry_id):
    """An ALFWorld entry's keys: its id and the tail from "trial_" on, which is the game's trial folder
    ('pick_and_place_simple-Mug-None-Desk-308_trial_T20190908_...' -> 'trial_T20190908_...')
    [ZJU-REAL/Agent-G2 gmsv/alfworld.py, _trial_id_aliases]."""
    i = entry_id.find("_trial_")
    return [entry_id] + ([entry_id[i + 1:]] if i >= 0 else [])


def parse_target_key(text):
    """'B07WMMYB6G::#2 navy#1|30#1'-style WebShop key text -> (ASIN, ((value, count), ...)) or None. A value
    may hold '|': parts are joined until one ends in '#<count>' [ZJU-REAL/Agent-G2 gmsv/webshop.py,
    normalize_target_key]."""
    if not isinstance(text, str) or "::" not in text:
        return None
    asin, rest = text.split("::", 1)
    options, pending = [], []
    for part in rest.split("|") if rest else []:
        pending.append(part)
        if re.search(r"#\d+\s*$", part):
            value, count = "|".join(pending).rsplit("#", 1)
            options.append((" ".join(value.lower().split()), int(count)))
            pending = []
    return asin.upper(), tuple(sorted(options))


def attach_expert_data(tasks, entries, env, key_of=None):
    """Give each task its entry's actions and thinks as its hint; a task without one keeps its walkthrough.
    ALFWorld: matched by trial folder (an id first, then the trial_ tail; the first entry wins an alias, a
    repeated id the last, as in theirs). WebShop: key_of(task) -> its target key (webshop.goal_target_key),
    matched against each entry's id; the first entry of a key wins (gmsv/webshop.py). -> (tasks, one-line
    note)."""
    index = {}
    if env == "webshop":
        for e in entries:
            index.setdefault(parse_target_key(e["id"]), e)
    else:
        by_id = {e["id"]: e for e in entries}
        for e in by_id.values():
            for a in trial_aliases(e["id"]):
                index.setdefault(a, e)
        index.update(by_id)
    out, counts = [], collections.Counter()
    for t in tasks:
        key = key_of(t) if env == "webshop" else os.path.basename(os.path.dirname(t["gamefile"]))
        e = index.get(key)
        counts["expert" if e else "walkthrough"] += 1
        out.append({**t, "walkthrough": e["actions"], "thinks": e["thinks"], "L": len(e["actions"])}
                   if e else t)
    note = (f"[hints] expert data: {counts['expert']} of {len(tasks)} training tasks matched; "
            f"{counts['walkthrough']} keep their own walkthrough")
    return out, note


# ---- the hint sources
class ExpertSource:
    """The tasks' expert trajectories (walkthroughs, or the expert data attach_expert_data put in their
    place); `dropped`: task ids treated as having none (--drop_walkthroughs). Learns nothing."""

    def __init__(self, tasks, dropped=()):
        self.trajectories = {t["id"]: (list(t["walkthrough"]), list(t.get("thinks") or [])) for t in tasks
                             if t["walkthrough"] and t["id"] not in set(dropped)}

    def hint(self, task):
        return self.trajectories.get(task["id"])

    def observe(self, episodes):
        return []

    def state_dict(self):
        return {}

    def load_state_dict(self, sd):
        pass


class SelfSource:
    """[beyond] The shortest won trajectory the policy has played per task: its episodes' "played" actions
    (the replayed prefix and the valid actions after it). No thinks: its aux targets carry an empty one."""

    def __init__(self):
        self.best = {}  # task id -> actions

    def hint(self, task):
        return (self.best[task["id"]], []) if task["id"] in self.best else None

    def observe(self, episodes):
        changed = []
        for e in episodes:
            if e["won"] and not e["error"] and (e["task_id"] not in self.best or
                                                len(e["played"]) < len(self.best[e["task_id"]])):
                self.best[e["task_id"]] = list(e["played"])
                changed.append(e["task_id"])
        return sorted(set(changed))

    def state_dict(self):
        return {"best": dict(self.best)}

    def load_state_dict(self, sd):
        self.best = {k: list(v) for k, v in sd["best"].items()}


class FirstOf:
    """[beyond] --hint_source self: the first source with a hint for the task (the expert's, else the policy's
    own win)."""

    def __init__(self, *sources):
        self.sources = sources

    def hint(self, task):
        return next((h for h in (s.hint(task) for s in self.sources) if h), None)

    def observe(self, episodes):
        return sorted({t for s in self.sources for t in s.observe(episodes)})

    def state_dict(self):
        return {str(j): s.state_dict() for j, s in enumerate(self.sources)}

    def load_state_dict(self, sd):
        for j, s in enumerate(self.sources):
            s.load_state_dict(sd[str(j)])


class Shortest(FirstOf):
    """[beyond] --hint_source mixed: the shortest of the sources' hints (an own win shorter than the expert's
    replaces it)."""

    def hint(self, task):
        hints = [h for h in (s.hint(task) for s in self.sources) if h]
        return min(hints, key=lambda h: len(h[0])) if hints else None


def dropped_ids(tasks, share):
    """[beyond] --drop_walkthroughs: a fixed share of the training tasks, drawn with one seed for every run
    (so every method and seed compares on the same tasks), treated as having no expert trajectory."""
    ids = sorted(t["id"] for t in tasks)
    return sorted(ids[i] for i in np.random.default_rng(2024).permutation(len(ids))[:round(share * len(ids))])


def make_source(cfg, tasks):
    """--hint_source: expert (the expert trajectories alone) | self (the expert's, and for a task without one
    the policy's own shortest win) | mixed (each task's shortest of the two) | module:Class (a source of your
    own, built as Class(cfg, tasks))."""
    if ":" in cfg.hint_source:
        return load_source(cfg.hint_source)(cfg, tasks)
    expert = ExpertSource(tasks, dropped_ids(tasks, cfg.drop_walkthroughs) if cfg.drop_walkthroughs else ())
    if cfg.hint_source == "expert":
        return expert
    return (FirstOf if cfg.hint_source == "self" else Shortest)(expert, SelfSource())


SOURCE_METHODS = ("hint", "observe", "state_dict", "load_state_dict")


def load_source(spec):
    """'module:Class' -> the class, importable from the working directory or sys.path; a clear error if the
    module, the class or one of the four methods is missing."""
    import importlib
    module_name, _, class_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--hint_source {spec}: cannot import {module_name!r} ({e})") from None
    cls = getattr(module, class_name, None)
    missing = [m for m in SOURCE_METHODS if not callable(getattr(cls, m, None))]
    if cls is None:
        raise ValueError(f"--hint_source {spec}: no class {class_name!r} in {module.__file__}")
    if missing:
        raise ValueError(f"--hint_source {spec}: {class_name} lacks {', '.join(missing)} "
                         f"(a hint source has {', '.join(SOURCE_METHODS)})")
    return cls


def group(source, task, n, R):
    """A rollout group: R episodes of `task` after the first n actions of its hint (none: n must be 0)."""
    actions, thinks = source.hint(task) or ([], [])
    if n > len(actions):
        raise ValueError(f"task {task['id']}: a prefix of {n} steps, but its hint has {len(actions)}")
    return {"task": task, "n": n, "R": R, "prefix": actions[:n], "thinks": thinks[:n]}
