"""The authors' expert data: their file read as their loader reads it, and matched to the training tasks as
they match it (ALFWorld by trial folder, WebShop by target key). A matched task replays the entry's actions
(L = their number) and its aux / SFT targets carry the entry's thinks; a task without one keeps its own
walkthrough, counted in the start-up log. (The hints built from these: rollout.ExpertSource.)

The authors' file is {"trajectories": [{"id", "task_type", "actions", "think"}, ...]}: 3,553 ALFWorld entries,
one per training game, each step with an LLM-written think. Their actions need not be the game's walkthrough
(several search shelf after shelf before they take the object): the hints the paper used are these. An
ALFWorld entry is matched to its game by the game's trial folder (trial_T..., the entry id's tail); a WebShop
entry by its target key (ASIN and option values).
"""
import collections
import json
import os
import re


def read_expert_file(path):
    """The entries of an expert file, read as the authors' loader reads them: actions stripped and empty ones
    dropped, each think kept beside its action ("" where the list runs short) [ZJU-REAL/Agent-G2
    gmsv/alfworld.py, GMSVAlfworldPrefixRuntime._load_expert_store]. An entry may instead hold RLVMR's
    annotated steps, "traj": [{"reason", "action"}] (variants/formats.py): the reasons stand where the thinks
    do (--prompt rlvmr checks each step's reply: config.check_data).
    -> [{"id", "actions", "thinks"}]; a malformed entry raises ValueError naming it."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"--expert_data {path}: no such file "
                                "(the authors' sft_data/alfworld_sft_data.json or "
                                "webshop_sft_data.json, from their repository or their Hugging Face dataset "
                                "xiamoent/Agent-G2-ALFWorld-Webshop-sft-data)")
    try:
        payload = json.load(open(path, encoding="utf-8"))
    except json.JSONDecodeError as e:  # one line naming the file and the place, not json's traceback
        raise ValueError(f"--expert_data {path}: not valid JSON at line {e.lineno}, column {e.colno} "
                         f"({e.msg})") from None
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
        if "traj" in item:  # RLVMR's annotated steps
            steps = item["traj"]
            if not isinstance(steps, list) or not all(isinstance(x, dict) and isinstance(x.get("action"), str)
                                                      and isinstance(x.get("reason"), str) for x in steps):
                raise ValueError(f"{name}: \"traj\" must be a list of {{\"reason\": str, \"action\": str}}")
            actions, thinks = [x["action"] for x in steps], [x["reason"] for x in steps]
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
