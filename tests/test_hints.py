"""hints.py: the authors' expert data, read as their loader reads it, matched to games as they match them."""
import dataclasses
import json
import os

import pytest

from config import Config
from tasks import load_tasks
from hints import attach_expert_data, parse_target_key, read_expert_file, trial_aliases


def trial(t):
    return os.path.basename(os.path.dirname(t["gamefile"]))


def write(path, entries):
    path.write_text(json.dumps({"trajectories": entries}))
    return str(path)


def test_entries_match_games_by_trial_and_the_rest_keep_their_walkthrough(tmp_path):
    """A hand-made file in the authors' format: entry ids are '<task folder>_<trial folder>' as theirs; the first
    matches game 0 by its trial_ tail, the second game 1 by a bare trial id; game 2 has none and keeps its
    walkthrough. The file's actions (a detour here) replace the walkthrough, its thinks ride along, and an action
    left empty is dropped with its think, as in their loader."""
    games = load_tasks("train", task_types=["pick_and_place_simple"])[:3]
    detour = ["go to shelf 1", " ", "go to shelf 2"] + games[0]["walkthrough"]
    path = write(tmp_path / "sft.json", [
        {"id": f"{games[0]['id'].split('/')[1]}_{trial(games[0])}", "task_type": "pick_and_place_simple",
         "actions": detour, "think": [f"t{j}" for j in range(len(detour))]},
        {"id": trial(games[1]), "actions": games[1]["walkthrough"]},  # no thinks
        {"id": "pick_and_place_simple-Mug-None-Desk-1_trial_T9999_99999_999", "actions": ["look"]},  # no such game
    ])
    entries = read_expert_file(path)
    assert entries[0]["actions"] == ["go to shelf 1", "go to shelf 2"] + games[0]["walkthrough"]
    assert entries[0]["thinks"] == ["t0", "t2"] + [f"t{j}" for j in range(3, len(detour))]  # t1 went with " "
    assert entries[1]["thinks"] == []
    tasks, note = attach_expert_data(games, entries, "alfworld")
    assert tasks[0]["walkthrough"] == entries[0]["actions"] and tasks[0]["L"] == len(games[0]["walkthrough"]) + 2
    assert tasks[0]["thinks"][:2] == ["t0", "t2"]
    assert tasks[1]["walkthrough"] == games[1]["walkthrough"] and tasks[1]["thinks"] == []
    assert tasks[2] == games[2] and "thinks" not in tasks[2]  # no entry: its own walkthrough
    assert note == "[hints] expert data: 2 of 3 training tasks matched; 1 keep their own walkthrough"
    assert trial_aliases("a-b_trial_T1_2") == ["a-b_trial_T1_2", "trial_T1_2"]


@pytest.mark.parametrize("entry, says", [
    ({"actions": ["look"]}, "entry 0: not an object with an \"id\""),
    ({"id": "x_trial_T1", "actions": "look"}, "entry 0 ('x_trial_T1'): \"actions\" must be a list of strings"),
    ({"id": "x_trial_T1", "actions": ["look"], "think": "why"}, "\"think\" must be a list of strings"),
    ({"id": "x_trial_T1", "actions": ["  "]}, "entry 0 ('x_trial_T1'): no action"),
])
def test_a_malformed_entry_is_a_clear_error_naming_it(tmp_path, entry, says):
    with pytest.raises(ValueError) as e:
        read_expert_file(write(tmp_path / "bad.json", [entry]))
    assert says in str(e.value) and str(tmp_path / "bad.json") in str(e.value)
    with pytest.raises(FileNotFoundError, match="xiamoent/Agent-G2-ALFWorld-Webshop-sft-data"):
        read_expert_file(str(tmp_path / "missing.json"))


def test_webshop_keys_as_the_authors_write_them():
    """'ASIN::value#count|...' (a value may hold '|'; values lower-cased, spaces collapsed), sorted like
    webshop.goal_target_key's (ASIN, sorted Counter of the option values)."""
    from webshop import goal_target_key
    assert parse_target_key("b07wmmyb6g::#2 navy#1|30#1") == ("B07WMMYB6G", (("#2 navy", 1), ("30", 1)))
    assert parse_target_key("B01::a|b#1|Large  Size#2") == ("B01", (("a|b", 1), ("large size", 2)))
    assert parse_target_key("B01::") == ("B01", ()) and parse_target_key("no key") is None
    goal = {"asin": "b01", "goal_options": {"size": "Large  Size", "x": "large size", "c": "a|b"}}
    assert goal_target_key(goal) == parse_target_key("B01::a|b#1|Large  Size#2")


def test_train_py_reads_the_expert_file_for_training_tasks_only(tmp_path):
    """tasks.tasks_for with --expert_data: the training split gets the entries; an evaluation split (hint-free) is
    untouched."""
    from tasks import tasks_for
    games = load_tasks("train", task_types=["pick_and_place_simple"])
    path = write(tmp_path / "sft.json", [{"id": trial(games[0]), "actions": ["look"] + games[0]["walkthrough"],
                                          "think": ["a"] * (games[0]["L"] + 1)}])
    c = dataclasses.replace(Config(), task_types="pick_and_place_simple", expert_data=path)
    train = tasks_for(c, "train")
    assert train[0]["walkthrough"] == ["look"] + games[0]["walkthrough"] and train[0]["thinks"][0] == "a"
    assert train[1:] == games[1:]
    assert tasks_for(c, "valid_seen") == load_tasks("valid_seen", task_types=["pick_and_place_simple"])
