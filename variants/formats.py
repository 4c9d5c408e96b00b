"""Reply formats beside the paper's (rollout.user_message, rollout.Reply), chosen once at setup by --prompt
and reached by the core through config.variant("formats", name). One here: RLVMR's.

RLVMR's reply format, prompt and tagged expert data (arXiv 2507.22844; the reference is Tencent/DigitalHuman
RLVMR/code, read at the fork zzjweb/digitalhuman 789ccd6): `--prompt rlvmr`, or its short form for the tiny
model, `--prompt rlvmr_compact` (ALFWorld only: RLVMR has no WebShop path). Its rule rewards and advantage:
variants/advantages.py RLVMR.

    python -m variants.formats standin --out data/rlvmr_standin.json     # the stand-in cold-start file
    python train.py --preset cpu_mix6 --prompt rlvmr_compact --mode sft_full \\
        --expert_data data/rlvmr_standin.json

Contract. A reply holds exactly one non-empty <planning>, <explore>, <reflection> or <monitor> pair before
exactly one <action>...</action> and no CJK character, else it is format-invalid (read); the action between
the action tags is played either way. The prompt shows the task, the last --history_length (observation,
action) pairs, the last three full replies with their observations, the admissible actions and the latest
plan ("No plan." until a reply holds a non-empty <planning>). A tagged-trajectory file holds RLVMR's
annotated steps, {"trajectories": [{"id": "<task_dir>_<trial_dir>", "traj": [{"reason":
"<planning>...</planning>", "action": "go to desk 1"}, ...]}]}, each step's reason and action as the
reference's annotation script keeps them; its target reply is "{reason}\\n<action>{action}</action>"
(scripts/alfworld_prepare.py).
"""
import argparse
import collections
import json
import re

SKILLS = ("planning", "reflection", "explore", "monitor")  # the projection's order (projection.py l.50-55)
SKILL_PAIRS = [re.compile(rf"<{s}>.*?</{s}>", re.IGNORECASE | re.DOTALL) for s in SKILLS]
CJK = re.compile(r"[\u4e00-\u9fff]")
NO_PLAN = "No plan."
# The stand-in's tag texts: one short sentence per tag, the same in the stand-in file and in the replies the
# constrained decoder allows (choices), so the cold start's targets are replies the decoder can emit.
STANDIN_TEXT = {"planning": "find it then finish the task", "explore": "try a new place",
                "reflection": "nothing happens so try another", "monitor": "go on"}
INSTRUCTION = ("First reason in one brief sentence inside exactly one tag pair: <planning> plan or replan "
               "the whole task </planning>, <explore> try new places or objects </explore>, <reflection> "
               "find why a step failed and correct it </reflection>, or <monitor> track progress against "
               "the plan </monitor>. Then give exactly one of the actions inside <action> </action>.")


def read(text, finished=True):
    """RLVMR's format rule on one reply, as alfworld_projection_rlvmr decides it (alfworld/projection.py
    l.49-113) -> (action or None, format-valid?, plan or None). The action: the one <action>...</action>'s
    text stripped (None when there are none or several, or the reply ran out of tokens); valid: no CJK
    character, exactly one action pair, exactly one skill pair over the four (an empty one counts), that one
    non-empty and before <action>. The plan: the first <planning> pair's text stripped, None when empty or
    absent (read whatever the validity, as the reference does)."""
    if not finished or not isinstance(text, str):
        return None, False, None
    m = re.search(r"<planning>([\s\S]*?)</planning>", text, re.IGNORECASE)
    plan = m.group(1).strip() or None if m else None
    actions = re.findall(r"<action>([\s\S]*?)</action>", text, re.IGNORECASE)
    action = actions[0].strip() if len(actions) == 1 else None
    valid = len(actions) == 1 and not CJK.search(text)
    first_action, count, found = text.lower().find("<action>"), 0, False
    for pair in SKILL_PAIRS:
        for m in pair.finditer(text):
            count += 1
            if re.sub(r"<.*?>", "", m.group(0)).strip():  # non-empty, and before the action tag
                found = True
                valid = valid and text.find(m.group(0)) <= first_action
    return action or None, valid and count == 1 and found, plan


def tag_of(text):
    """The tag a format-valid reply is rewarded under: substring checks in the order planning, explore,
    reflection (core_rlvmr.py l.98-128); monitor (or none found) -> "none", the group it shares with invalid
    replies."""
    return next((t for t in ("planning", "explore", "reflection") if f"<{t}>" in text), "none")


def tag_counts(rows):
    """The rows' replies by the tag they are written under, whatever the estimator (rollout.Turns.finish, the
    step record's "tags"): a format-valid reply by its one skill pair (planning, explore, reflection,
    monitor), any other "invalid". rows: dicts with "text", "format". -> {"tag_<name>": count}"""
    tag = lambda text: next(s for s, p in zip(SKILLS, SKILL_PAIRS) if p.search(text))  # noqa: E731
    return dict(collections.Counter("tag_" + (tag(r["text"]) if r["format"] else "invalid") for r in rows))


def action_list(text):
    """re.findall(r'<action>(.*?)</action>') on the raw reply: what core_rlvmr.py compares between steps
    (l.111-113, l.129-134): case-sensitive, one line, unstripped."""
    return re.findall(r"<action>(.*?)</action>", text)


def plan_of(outputs):
    """The plan the prompt carries: the latest non-empty <planning> text among the replies so far, else
    "No plan." (env_manager.py l.42, l.160-165). outputs: [(observation, reply)]."""
    plans = [p for _, text in outputs if (p := read(text)[2]) is not None]
    return plans[-1] if plans else NO_PLAN


def message(task, room, history, obs, admissible, step, outputs, hint, cfg):
    """The user message of one decision under --prompt rlvmr (the structure of ALFWORLD_TEMPLATE_MC,
    prompts/alfworld.py l.129; its tag instructions shortened to one paragraph). history: the (observation,
    action) pairs so far, the last --history_length shown; outputs: every earlier step's (observation, reply),
    prefix steps included; the last three are shown in full. room: unused (the first observation has it)."""
    history = history[-cfg.history_length:] if cfg.history_length > 0 else []
    lines = [f"You are an agent in a household text world. Your task is to: {task}",
             *([f"Hint: {hint}"] if hint else []), f"You have already taken {step} step(s)."]
    if history:
        lines.append(f"Your most recent {len(history)} observation(s) and action(s):")
        lines += [f"[Observation {i}: '{o}', Action {i}: '{a}']"
                  for i, (o, a) in enumerate(history, start=step - len(history) + 1)]
    if outputs:
        recent = outputs[-3:]
        lines.append("Your recent reasoning:")
        lines += [f"[Observation {i}: {o}, output: '{r}']"
                  for i, (o, r) in enumerate(recent, start=len(outputs) - len(recent) + 1)]
    lines += [f"You are now at step {step + 1} and your current observation is: {obs}",
              "The actions you can take now: " + ", ".join(admissible),
              f"Your previous overall plan is: {plan_of(outputs)}. Please strictly adhere to your plan.",
              INSTRUCTION]
    return "\n".join(lines)


def compact_message(task, room, history, obs, admissible, step, outputs, hint, cfg):
    """--prompt rlvmr_compact: the same parts in the compact prompt's short form (rollout.user_message's
    compact branch, for the tiny model): every past action, the last three replies, the plan, the current
    observation, and the options and the reply's form unless the decoder is constrained to them."""
    recent = " | ".join(" ".join(r.split()) for _, r in outputs[-3:]) or "-"
    msg = (f"task: {task}\n" + (f"hint: {hint}\n" if hint else "") + (f"room: {room}\n" if room else "")
           + f"done: {' | '.join(a for _, a in history) or '-'}\nrecent: {recent}\nplan: {plan_of(outputs)}\n"
           f"now: {obs}")
    if not cfg.constrained:
        msg += (f"\noptions: {' | '.join(admissible)}\nreply: one of <planning> <explore> <reflection> "
                "<monitor> with one sentence, then <action> one option </action>")
    return msg


def reply_text(reason, action):
    """A tagged step as a reply: the annotation script's "{reason}\\n<action>{action}</action>"
    (scripts/alfworld_prepare.py, its response; the trailing newline left out: the reply ends at EOS)."""
    return f"{reason}\n<action>{action}</action>"


def choices(command):
    """The replies the constrained decoder allows for one admissible command under --prompt rlvmr: each tag
    with its stand-in text, then the command (the decoder cannot write free text inside a tag)."""
    return [reply_text(f"<{s}>{STANDIN_TEXT[s]}</{s}>", command) for s in SKILLS]


def standin_reasons(actions):
    """The stand-in's tag for each expert step, by a stated rule (not RLVMR's data, which an LLM annotated):
    planning at the first step, explore on a "go to" a place not visited before or a take / open of an object
    not handled before, reflection after an invalid step (an expert trajectory has none), monitor otherwise.
    -> ["<tag>text</tag>"]"""
    out, seen = [], set()
    for t, a in enumerate(actions):
        verb, _, target = a.partition(" ")
        target = a[len("go to "):] if a.startswith("go to ") else target.split(" from ")[0]
        new = verb in ("go", "take", "open") and target not in seen
        seen.add(target)
        tag = "planning" if t == 0 else "explore" if new else "monitor"
        out.append(f"<{tag}>{STANDIN_TEXT[tag]}</{tag}>")
    return out


def check_steps(path, entries):
    """Every tagged step's reply against the format rule (read): the first that fails raises a one-line
    ValueError naming the file, entry and step (a file whose steps are untagged thinks fails at its first)."""
    for e in entries:
        for t, (a, reason) in enumerate(zip(e["actions"], e["thinks"] or [""] * len(e["actions"]))):
            if not read(reply_text(reason, a))[1]:
                raise ValueError(f"--expert_data {path}: entry {e['id']!r} step {t}: {reason[:40]!r} then "
                                 f"{a!r} is not a reply in RLVMR's format (exactly one non-empty <planning>, "
                                 "<explore>, <reflection> or <monitor> pair before the action)")


def standin(out, games="builtin", cache=None):
    """Write the stand-in tagged file: every ALFWorld training game's walkthrough (built-in or official
    games), tagged by standin_reasons. -> the number of trajectories."""
    import os
    from plumbing.gamegen import load_tasks
    tasks = load_tasks("train", games, cache)
    items = [{"id": os.path.basename(os.path.dirname(t["gamefile"])),
              "traj": [{"reason": r, "action": a} for r, a in zip(standin_reasons(t["walkthrough"]),
                                                                   t["walkthrough"])]}
             for t in tasks if t["walkthrough"]]
    note = ("A STAND-IN for RLVMR's cold-start data, not that data (which gpt-4o annotated and is not "
            "released): the built-in games' walkthroughs, tagged by variants/formats.py standin_reasons.")
    with open(out, "w") as f:
        json.dump({"note": note, "trajectories": items}, f, indent=1)
    return len(items)


class RLVMR:
    """--prompt rlvmr's hooks, as the core calls them: read(text, finished) -> (action, valid, plan);
    message(...) -> the user message; choices(command) -> the replies the constrained decoder allows;
    reply_text(reason, action) -> an expert step's target; check_steps(path, entries) (config.check_data);
    tag_counts(rows) -> the rollout's rows by tag (the step record's "tags")."""
    read, message, choices = staticmethod(read), staticmethod(message), staticmethod(choices)
    reply_text, check_steps = staticmethod(reply_text), staticmethod(check_steps)
    tag_counts = staticmethod(tag_counts)


class RLVMRCompact(RLVMR):
    """--prompt rlvmr_compact: RLVMR's format with compact_message for its prompt."""
    message = staticmethod(compact_message)


REGISTRY = {"rlvmr": RLVMR, "rlvmr_compact": RLVMRCompact}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="RLVMR's stand-in cold-start file")
    p.add_argument("what", choices=["standin"])
    p.add_argument("--out", default="data/rlvmr_standin.json")
    p.add_argument("--games", default="builtin", choices=["builtin", "official"])
    a = p.parse_args()
    print(f"[rlvmr] {standin(a.out, a.games)} stand-in tagged trajectories ({a.games} games) -> {a.out}")
