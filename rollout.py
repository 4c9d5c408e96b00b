"""Batched multi-turn agent rollouts, in the order they are built: the hint a prefix comes from, a rollout
group, prompts, replies and their reward (the reply rule), two engines (vLLM, HF generate) behind one
interface, the vLLM weight sync, and the rollout loop over the env pool.

    hints, reply = make_hints(cfg, tasks), Reply(cfg)   # at setup (hints: ExpertSource or a variant's)
    out = rollout(engine, pool, tok, [group(task, hints.hint(task), n, R)], cfg, seed, reply)
    out["rows"]      per-step training rows (prompt ids, response ids, engine log-probs, group / episode /
                     step, valid, reward; obs, action, milestone: for the advantage estimators)
    out["aux"]       one row per expert-prefix step: the prompt the policy would have seen + the expert reply
                     (with its think where the prompt asks for one), "n" = the prefix's length
    out["episodes"]  won, reward, steps, invalid, error, played (the prefix and the valid actions after it)
    out["stats"]     rollouts, env steps, generated tokens, gen/env/overhead seconds, truncations

Each turn, every live episode generates in one engine call (--overlap: each as its observation comes);
finished ones drop out. Prefix steps are in the history like the agent's own and count against max_steps.
"""
import dataclasses
import functools
import itertools
import random
import re
import time
from typing import NamedTuple

import torch

from envs import env_class
from grpo import FREE
# the engines (machinery, plumbing/engines.py), named here too: rollout's interface since it held them
from plumbing.engines import (HFEngine, VLLMEngine, engine_kwargs, make_engine, seed63,  # noqa: F401
                              sync_check, sync_weights, vllm_reply)
from plumbing.plugins import plugin
from plumbing.streams import stream_seed


# ----------------------------------------------------------------------------------------------
# Hints: where a replayed prefix (and a line of the prompt) comes from
# ----------------------------------------------------------------------------------------------
class Hint(NamedTuple):
    """A task's hint: `actions` to replay the first n of (L = len(actions)), their `thinks` (the aux targets'
    reasoning; may be empty), a `text` for the prompt ("": none; else a line "Hint: <text>" after the task)"""
    actions: list
    thinks: list = []
    text: str = ""


class ExpertSource:
    """The paper's hint source: each task's expert trajectory (its walkthrough, or the authors' expert data in
    its place, with its thinks); learns nothing. A hint source: hint(task) -> Hint | None, asked once per task
    per step (and at setup); observe(every rank's episodes {"task_id", "won", "error", "played"}) -> the
    ids of the tasks whose hint changed; state_dict / load_state_dict (JSON). Others: variants/hints.py."""

    def __init__(self, tasks):
        self.trajectories = {t["id"]: Hint(list(t["walkthrough"]), list(t.get("thinks") or []))
                             for t in tasks if t["walkthrough"]}

    def hint(self, task):
        return self.trajectories.get(task["id"])

    def observe(self, episodes):
        return []

    def state_dict(self):
        return {}

    def load_state_dict(self, sd):
        pass


def make_hints(cfg, tasks):
    """--hint_source expert, no --drop_walkthroughs: ExpertSource; else (self, mixed, expert less a dropped
    share, file:Class) Class(cfg, tasks), looked up once through config.variant (variants/hints.py)."""
    if cfg.hint_source == "expert" and not cfg.drop_walkthroughs:
        return ExpertSource(tasks)
    from config import variant
    return variant("hints", "dropped" if cfg.hint_source == "expert" else cfg.hint_source)(cfg, tasks)


def group(task, hint, n, R):
    """A rollout group: R episodes of `task` after the first n actions of its hint (None: n = 0), its text."""
    actions, thinks, text = hint or Hint([])
    if n > len(actions):
        raise ValueError(f"task {task['id']}: a prefix of {n} steps, but its hint has {len(actions)}")
    return {"task": task, "n": n, "R": R, "prefix": list(actions[:n]), "thinks": list(thinks[:n]),
            "text": text}


# ----------------------------------------------------------------------------------------------
# Prompt protocol (docs/method.md §7) and parsing
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(None)
def reply_format(prompt):
    """--prompt's reply format beyond full and compact (variants/formats.py: rlvmr, through config.variant,
    looked up once), else None."""
    if prompt in ("full", "compact"):
        return None
    from config import variant
    return variant("formats", prompt)


def user_message(task, room, history, obs, admissible, step, cfg, hint="", outputs=()):
    """The single-turn user message for one decision. history: [(obs, action)], prefix steps included. hint: a
    hint's text, shown on a line of its own after the task ("": no line, the prompt as without hints).
    outputs: every earlier step's (obs, reply) (--prompt rlvmr shows the last three and their plan)."""
    if fmt := reply_format(cfg.prompt):
        return fmt.message(task, room, history, obs, admissible, step, outputs, hint, cfg)
    if cfg.prompt == "compact":  # tiny-model variant: every past action, short observation, action tag only
        done = " | ".join(a for _, a in history) or "-"
        obs = obs.replace(" [SEP] ", " | ")  # WebShop pages: shorter separators (ALFWorld text has none)
        msg = (f"task: {task}\n" + (f"hint: {hint}\n" if hint else "") + (f"room: {room}\n" if room else "")
               + f"done: {done}\nnow: {obs}")
        if not cfg.constrained:  # under constrained decoding the decoder already knows the options
            msg += f"\noptions: {' | '.join(admissible)}\nreply: <action> one option </action>"
        return msg
    past = history[-cfg.history_length:] if cfg.history_length > 0 else []
    who, tip = env_class(cfg.env).wording  # the agent's wording comes with the environment (envs.ENVS)
    lines = [f"You are {who}. Your task is to: {task}", *([f"Hint: {hint}"] if hint else []),
             f"You have already taken {step} step(s)."]
    if past:
        lines.append(f"Your most recent {len(past)} observation(s) and action(s):")
        for i, (o, a) in enumerate(past, start=step - len(past) + 1):
            lines += [f"[Observation {i}] {o}", f"[Action {i}] {a}"]
    lines += [f"Current observation: {obs}", "The actions you can take now: " + ", ".join(admissible),
              "First reason briefly inside <think> </think>, then reply with exactly one of the actions "
              "inside <action> </action>." + (f" {tip}" if tip else "")]
    return "\n".join(lines)


def expert_reply(action, think=None, fmt=None):
    """An expert action as a policy reply (aux and SFT targets): the action tag alone, or (think not None: the
    full prompt) "<think>{think}</think>\n<action>{action}</action>" as the authors render prefix-SFT targets
    [ZJU-REAL/Agent-G2 agent_system/multi_turn_rollout/rollout_loop.py, _build_prefix_sft_batch]; fmt (a
    reply format): its reply_text, the think its tagged reason."""
    if fmt is not None:
        return fmt.reply_text(think or "", action)
    if think is None:
        return f"<action>{action}</action>"
    return f"<think>{think}</think>\n<action>{action}</action>"


def target_think(thinks, t, cfg):
    """The think of expert step t in its target: None (no think tag) under the compact prompt or the full one
    decoded constrained (the decoder allows action tags only); else the hint's think (rlvmr: its tagged
    reason), "" when it has none."""
    if cfg.prompt == "compact" or cfg.prompt == "full" and cfg.constrained:
        return None
    return thinks[t] if t < len(thinks) else ""


def chat_ids(tok, message):
    """The chat template around one user message, tokenised, with the assistant's turn opened."""
    return chat_ids_batch(tok, [message])[0]


def chat_ids_batch(tok, messages):
    """chat_ids of several messages, the batch encoded at once (the same ids as one at a time)."""
    chats = [[{"role": "user", "content": m}] for m in messages]
    ids = chats and tok.apply_chat_template(chats, add_generation_prompt=True, return_dict=False)
    return [list(x) for x in (ids["input_ids"] if isinstance(ids, dict) else ids)]


def fit_prompt(tok, task, room, history, obs, admissible, step, cfg, hint="", outputs=()):
    """The prompt of one decision within --max_prompt_tokens -> (ids, truncated?). An over-long one drops past
    steps, oldest first; the task line (and a hint's line) and the current observation stay; with no history
    left, the middle goes (the first quarter of the budget stays, the rest from the end). (The authors
    truncate from the left, which drops the task first: data.truncation=left.)"""
    first = max(0, len(history) - cfg.history_length) if "compact" not in cfg.prompt else 0  # 1st shown
    for j in range(first, len(history) + 1):
        ids = chat_ids(tok, user_message(task, room, history[j:], obs, admissible, step, cfg, hint, outputs))
        if len(ids) <= cfg.max_prompt_tokens:
            return ids, j > first
    head = cfg.max_prompt_tokens // 4
    return ids[:head] + ids[len(ids) - (cfg.max_prompt_tokens - head):], True


def fit_prompts(tok, turns, cfg):
    """fit_prompt for a turn, turns: [(task, room, history, obs, admissible, step, hint, outputs)]; the
    prompts in one batch, one over --max_prompt_tokens through fit_prompt's loop. -> [(ids, truncated?)]"""
    first = [max(0, len(t[2]) - cfg.history_length) if "compact" not in cfg.prompt else 0 for t in turns]
    whole = chat_ids_batch(tok, [user_message(task, room, history[j:], obs, adm, step, cfg, hint, outs) for j,
                                 (task, room, history, obs, adm, step, hint, outs) in zip(first, turns)])
    return [(ids, False) if len(ids) <= cfg.max_prompt_tokens else fit_prompt(tok, *t[:6], cfg, *t[6:])
            for ids, t in zip(whole, turns)]


def parse_action(text, finished=True):
    """The text between the first <action> and the next </action>, stripped; None if missing, empty, or the
    reply ran out of tokens (over-long)."""
    if not finished or not isinstance(text, str):
        return None
    i = text.find("<action>")
    j = text.find("</action>", i + 8) if i >= 0 else -1
    if i < 0 or j < 0:
        return None
    return " ".join(text[i + 8:j].split()) or None


CJK = re.compile(r"[\u4e00-\u9fff]")


class Reply:
    """The reply rule, built once at setup: read(text, finished) -> (action or None, valid?); rewards: Reward
    or --reward's. --preset paper reads as the authors' projection does [verl-agent's alfworld_projection]:
    --parse_lower reads the lower-cased reply; --parse_think makes one without <think>...</think>, or with a
    CJK character, invalid (still played). --prompt rlvmr: its format's rule alone (variants/formats.py)."""

    def __init__(self, cfg):
        self.lower, self.think, self.format = cfg.parse_lower, cfg.parse_think, reply_format(cfg.prompt)
        self.rewards = Reward(cfg) if cfg.reward == "paper" else plugin("reward", cfg.reward)(cfg)

    def read(self, text, finished):
        if self.format:
            return self.format.read(text, finished)[:2]
        text = text.lower() if self.lower and isinstance(text, str) else text
        action = parse_action(text, finished)
        ok = action is not None
        if ok and self.think:
            ok = "<think>" in text and "</think>" in text and not CJK.search(text)
        return action, ok



class Reward:
    """The paper's reward of a finished Episode: episode(ep) = --reward_scale won - --invalid_penalty invalid
    steps; rows(ep, reward): that reward, asked once, on every row (--adv_level traj), or won minus the row's
    own penalty (step, the released code's). Yours: a subclass overriding episode, --reward file:Class;
    stats(): logged "reward"."""

    def __init__(self, cfg):
        self.scale, self.penalty, self.adv_level = cfg.reward_scale, cfg.invalid_penalty, cfg.adv_level

    def episode(self, ep):
        return self.scale * float(ep.won) - self.penalty * ep.invalid

    def rows(self, ep, reward):  # reward: episode(ep) (an error episode's rows' rewards are never read)
        if self.adv_level == "traj":
            return [reward] * len(ep.rows)
        return [self.scale * float(ep.won) - self.penalty * float(not r["valid"]) for r in ep.rows]

    def stats(self):
        return {}


def _free_head():
    from plumbing.webshop import SEARCH_ACTION
    return "<action>" + SEARCH_ACTION.split("<")[0]  # '<action>search['


def choice_ids(tok, commands, fmt=None):
    """Token sequences of every allowed reply (constrained decoding). A command with a free-text slot
    (WebShop's 'search[<query>]') allows its literal start, then anything (grpo.FREE): the query is the
    policy's own text. fmt (a reply format, --prompt rlvmr): each of its choices for the command. Each command
    is tokenised once per tokenizer (_choice: a turn asks again for most)."""
    if fmt is None:
        return [list(_choice(tok, c)) for c in commands]
    return [list(_reply_ids(tok, reply)) for c in commands for reply in fmt.choices(c)]


@functools.lru_cache(65536)
def _choice(tok, command):
    from plumbing.webshop import SEARCH_ACTION
    if command == SEARCH_ACTION:
        return tuple(tok.encode(_free_head(), add_special_tokens=False)) + (FREE,)
    return _reply_ids(tok, expert_reply(command))


@functools.lru_cache(65536)
def _reply_ids(tok, reply):  # a whole reply's ids + EOS, tokenised once per tokenizer
    return tuple(tok.encode(reply, add_special_tokens=False)) + (tok.eos_token_id,)


def expert_ids(tok, action, think=None, fmt=None):
    """An expert action as reply ids + EOS (aux and SFT targets), along a path the constrained decoder
    allows: a search's literal start encoded alone, as in choice_ids (a tokenizer may merge '[' with the
    query). think, fmt: as expert_reply."""
    reply, head = expert_reply(action, think, fmt), _free_head()
    if reply.startswith(head):
        return (tok.encode(head, add_special_tokens=False)
                + tok.encode(reply[len(head):], add_special_tokens=False) + [tok.eos_token_id])
    return tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]


# ----------------------------------------------------------------------------------------------
# The rollout loop
# ----------------------------------------------------------------------------------------------
episode_ids = itertools.count(1)  # one id per episode this process plays: the env workers' handle


@dataclasses.dataclass
class Episode:
    """One rollout in flight. task: the task's record; goal: its goal as the environment states it; played:
    the prefix's n actions, then each action the environment took (a reply invalid in format but played
    included); history: (observation, action) pairs; outputs: (observation, reply) pairs, the prefix's
    expert replies first, under a reply format only (--prompt rlvmr shows them);
    steps: env steps, the prefix's included (they count against --max_steps); key: its sampling stream."""
    eid: int
    gid: int
    task: dict
    n: int
    played: list
    thinks: list
    text: str
    key: tuple = None
    rows: list = dataclasses.field(default_factory=list)
    goal: str = ""
    room: str = ""
    obs: str = ""
    admissible: list = dataclasses.field(default_factory=list)
    history: list = dataclasses.field(default_factory=list)
    outputs: list = dataclasses.field(default_factory=list)
    steps: int = 0
    won: bool = False
    score: float = 0.0
    invalid: int = 0
    error: str = None
    done: bool = False


def rollout(engine, pool, tok, groups, cfg, seed=0, reply=None):
    """Run every group's R episodes to the end in lock-step turns: every live episode's reply in one engine
    call, then every env step in one pool call; finished episodes drop out. groups: [{"task", "n": prefix
    length, "R", "prefix": the n hint actions to replay, "thinks": theirs (may be empty), "text": the hint's
    text for the prompt (may be absent)}] (group builds one). reply: the reply rule built at setup (None:
    Reply(cfg)). --overlap: rollout_overlapped. -> {"rows", "aux", "episodes", "stats"} (module docstring)."""
    play = Turns(tok, groups, cfg, seed, reply)
    aux = play.reset(pool)  # each episode stands after its prefix; the prefix's steps become aux rows
    if play.streams and cfg.overlap:
        return rollout_overlapped(engine, pool, play, aux)
    turn, live = 0, [e for e in play.episodes if not e.done]
    while live:
        prompts, allowed, seeds = play.prompts(live, turn)
        outs = play.timed("t_gen", engine.generate, prompts, cfg.max_new_tokens, cfg.temperature, seeds,
                          allowed)
        reqs = [play.take(e, p, allowed and allowed[j], o)
                for j, (e, p, o) in enumerate(zip(live, prompts, outs))]
        for e, req, r in zip(live, reqs, play.timed("t_env", pool.run, reqs)):
            play.settle(e, req, r)
        turn, live = turn + 1, [e for e in live if not e.done]
    return play.finish(pool, aux)


class Turns:
    """One rollout call's episodes and what both drivers do with them: reset after the prefix (the aux rows),
    a turn's prompts, a reply read into a row and an env request, the env's answer settled, the output."""

    def __init__(self, tok, groups, cfg, seed, reply):
        self.tok, self.cfg, self.seed, self.t_start = tok, cfg, seed, time.time()
        self.reply, self.n_groups = Reply(cfg) if reply is None else reply, len(groups)
        self.stats = dict(rollouts=0, env_steps=0, gen_tokens=0, t_gen=0.0, t_env=0.0, prompts=0, truncated=0,
                          invalid=0, errors=0, prefix_steps=0)
        self.streams = cfg.sample_streams == "episode" and all(g.get("key") for g in groups)  # else engine's
        self.episodes = [Episode(next(episode_ids), gid, g["task"], g["n"], list(g["prefix"]),
                                 g.get("thinks") or [], g.get("text") or "",
                                 (*g["key"], r) if self.streams else None)  # its stream, with the turn
                         for gid, g in enumerate(groups) for r in range(g["R"])]

    def timed(self, key, f, *a):  # f(*a), its seconds added to stats[key]
        t0 = time.time()
        out = f(*a)
        self.stats[key] += time.time() - t0
        return out

    def reset(self, pool):
        """Every episode reset and its prefix replayed by the env workers -> the aux rows: one per prefix step
        of each group (its R episodes share them): the prompt the policy would have seen, the expert reply."""
        cfg, st, aux, aux_done, fmt = self.cfg, self.stats, [], set(), self.reply.format
        res = self.timed("t_env", pool.run,
                         [("reset", e.eid, e.task["gamefile"], e.played) for e in self.episodes])
        for e, r in zip(self.episodes, res):
            st["rollouts"] += 1
            if not r["ok"]:
                e.done, e.error = True, r["error"]
                st["errors"] += 1
                continue
            e.obs, e.admissible, e.won = r["obs"], r["admissible"], r["won"]
            e.history = list(map(tuple, r["history"]))
            e.outputs = [(o, expert_reply(a, target_think(e.thinks, t, cfg), fmt))  # only a format shows them
                         for t, (o, a) in enumerate(e.history)] if fmt else []
            e.goal, e.room = r["task"], r["room_short" if "compact" in cfg.prompt else "room"]
            e.score, e.steps = r.get("score", float(r["won"])), len(r["history"])
            st["prefix_steps"] += e.steps
            if e.gid not in aux_done:  # the prefix is shared by the group's R rollouts: one set of aux rows
                aux_done.add(e.gid)
                for t, (o, adm, a) in enumerate(r["prefix_steps"]):
                    ids, _ = fit_prompt(self.tok, e.goal, e.room, e.history[:t], o, adm, t, cfg, e.text,
                                        e.outputs[:t])
                    aux.append({"prompt_ids": ids,  # allowed: scored as constrained play samples (§2.2)
                                "response_ids": expert_ids(self.tok, a, target_think(e.thinks, t, cfg), fmt),
                                "gid": e.gid, "t": t, "n": len(r["prefix_steps"]),
                                **({"allowed": choice_ids(self.tok, adm, fmt)} if cfg.constrained else {})})
            e.done = e.won or e.steps >= cfg.max_steps
        return aux

    def prompts(self, live, turn):  # the live episodes' prompts -> (prompts, allowed or None, sampling seeds)
        fitted = fit_prompts(self.tok, [(e.goal, e.room, e.history, e.obs, e.admissible, e.steps, e.text,
                                         e.outputs) for e in live], self.cfg)
        self.stats["truncated"] += sum(tr for _, tr in fitted)
        self.stats["prompts"] += len(live)
        fmt = self.reply.format
        allowed = [choice_ids(self.tok, e.admissible, fmt) for e in live] if self.cfg.constrained else None
        seeds = [stream_seed(*e.key, e.steps) for e in live] if self.streams else self.seed * 1000 + turn
        return [ids for ids, _ in fitted], allowed, seeds

    def take(self, e, prompt, allowed, o):  # an episode's reply -> its training row; -> its env request
        self.stats["gen_tokens"] += len(o["ids"])
        text = self.tok.decode(o["ids"], skip_special_tokens=True)
        action, ok = self.reply.read(text, o["finished"])
        e.rows.append({"prompt_ids": prompt, "response_ids": o["ids"], "logprobs": o["logprobs"],
                       "gid": e.gid, "eid": e.eid, "t": e.steps, "valid": ok, "text": text, "format": ok,
                       "available": action in e.admissible,  # the reply's format alone; its action admissible
                       "obs": e.obs, "action": action or "",  # the raw observation acted on, the action sent
                       **({"allowed": allowed} if allowed is not None else {})})
        return ("step", e.eid, action or "")

    def settle(self, e, req, r):  # the worker's answer to an episode's step
        st = self.stats
        e.steps += 1
        st["env_steps"] += 1
        if not r["ok"]:
            e.done, e.won, e.error = True, False, r["error"]
            st["errors"] += 1
            return
        row = e.rows[-1]
        row["valid"] = row["valid"] and r["valid"]
        row["milestone"] = r.get("milestone", False)  # a WebShop milestone reached by this step (BEACON)
        if r["valid"]:  # the environment took it (a format-invalid reply may still have been played)
            e.played.append(req[2])
        e.invalid += not row["valid"]
        st["invalid"] += not row["valid"]
        e.history.append((e.obs, req[2]))
        if self.reply.format:
            e.outputs.append((e.obs, row["text"]))
        e.obs, e.admissible, e.won, e.score = r["obs"], r["admissible"], r["won"], r["score"]
        e.done = e.won or r["done"] or e.steps >= self.cfg.max_steps

    def finish(self, pool, aux):
        """Close the episodes in the workers -> the rollout's output: episodes (records), rows with their
        rewards, aux rows with their group's success rate, stats."""
        pool.run([("close", e.eid) for e in self.episodes])
        episodes, rows, reply = [], [], self.reply
        for e in self.episodes:
            reward = reply.rewards.episode(e)  # once an episode: a reward rule may count what it sees
            episodes.append({"eid": e.eid, "gid": e.gid, "task_id": e.task["id"], "n": e.n,
                             "played": e.played, "won": bool(e.won), "reward": reward, "steps": e.steps,
                             "score": float(e.score) if not e.error else 0.0, "invalid": e.invalid,
                             "error": e.error})
            for r, rr in zip(e.rows, reply.rewards.rows(e, reward)):
                r["reward"] = rr  # traj: the episode's reward; step (released): won minus this step's penalty
                rows.append(r)
        flags = group_successes({"episodes": episodes}, self.n_groups)  # per group: kept 0/1 outcomes
        for a in aux:  # its group's success rate (None: every episode lost to an error); a term may read it
            a["success"] = sum(flags[a["gid"]]) / len(flags[a["gid"]]) if flags[a["gid"]] else None
        st = self.stats
        if reply.format:  # the replies' tags, whatever the estimator (the step record's "tags")
            st.update(reply.format.tag_counts(rows))
        st["t_total"] = time.time() - self.t_start
        st["t_overhead"] = st["t_total"] - st["t_gen"] - st["t_env"]
        return {"rows": rows, "aux": aux, "episodes": episodes, "stats": st}


def rollout_overlapped(engine, pool, play, aux):
    """--overlap: rollout's episodes (reset) without lock-step turns: each reply goes to the workers as the
    engine finishes it, each next prompt joins the running engine as its observation comes back (each episode
    samples from its own stream, so what shares an engine step changes no sample). stats' t_env: the time the
    engine waited for the workers."""
    cfg = play.cfg
    asked, ready, stepping = {}, [e for e in play.episodes if not e.done], 0
    by_eid = {e.eid: e for e in play.episodes}
    while ready or asked or stepping:
        if ready:
            prompts, allowed, seeds = play.prompts(ready, 0)
            handles = engine.submit(prompts, cfg.max_new_tokens, cfg.temperature, seeds, allowed)
            asked.update({h: (e, p, allowed and allowed[j])
                          for j, (h, e, p) in enumerate(zip(handles, ready, prompts))})
            ready = []
        if asked:
            reqs = [play.take(*asked.pop(h), o) for h, o in play.timed("t_gen", engine.poll)]
            pool.send(reqs)
            stepping += len(reqs)
        answers = play.timed("t_env", pool.poll, not asked)  # wait for the workers only when idle
        for req, r in answers:
            play.settle(by_eid[req[1]], req, r)
        stepping -= len(answers)
        ready = [by_eid[req[1]] for req, _ in answers if not by_eid[req[1]].done]
    return play.finish(pool, aux)


def group_successes(out, n_groups):
    """Per group: list of 0/1 won flags, in episode order (error episodes left out)."""
    flags = [[] for _ in range(n_groups)]
    for e in out["episodes"]:
        if not e["error"]:  # an episode lost to an engine error says nothing about the task's difficulty
            flags[e["gid"]].append(int(e["won"]))
    return flags


def seed_all(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    import numpy as np
    np.random.seed(seed % 2**32)


# ----------------------------------------------------------------------------------------------
# The player: who plays a step's groups (the probe and SFT baselines' players: variants/players.py)
# ----------------------------------------------------------------------------------------------
class Player:
    """The paper's player: this rank's R rollouts per task after each task's n-step prefix, in one rollout
    call. plays: the policy plays (the SFT baselines' player does not); stats: a probe rule's (none here)."""
    plays = True

    def __init__(self, engine, pool, tok, cfg, reply=None, rank=0, gather=lambda x: [x]):
        self.engine, self.pool, self.tok, self.cfg, self.reply = engine, pool, tok, cfg, reply
        self.rank, self.gather, self.stats = rank, gather, {}

    def prober(self, step, tasks, hints, mine):  # the probe rules' callback: none on the paper's path
        return None

    def play(self, step, tasks, hints, n, pos):  # this rank's tasks, hints, depths, places in the batch
        groups = [{**group(t, h, ni, self.cfg.group_size), "key": ("train", self.cfg.seed, step, p)}
                  for t, h, ni, p in zip(tasks, hints, n, pos)]
        return rollout(self.engine, self.pool, self.tok, groups, self.cfg,
                       self.cfg.seed * 1_000_003 + step * 1009 + self.rank, self.reply)


def make_player(cfg, rule, engine, pool, tok, reply=None, rank=0, gather=lambda x: [x]):
    """The paper's Player, or (an SFT mode, a rule that probes) its player in variants/players.py, looked up
    once through config.variant."""
    kind = ("sft" if cfg.mode in ("sft_full", "sft_prefix") else
            "probe" if getattr(rule, "probes", False) else None)
    if kind is None:
        return Player(engine, pool, tok, cfg, reply, rank, gather)
    from config import variant
    return variant("players", kind)(engine, pool, tok, cfg, reply, rank, gather)

