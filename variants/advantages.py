"""Advantage estimators beside the paper's GRPO (grpo.GRPO), chosen once at setup by `--advantage`:

  gigpo   [baseline] GiGPO (arXiv 2505.10978, verl-agent): an episode advantage over all step rows of a
          group plus omega (--step_adv_w) times a step advantage, the discounted return grouped by the
          raw observation the step acted on (its anchor state)
  beacon  [baseline] BEACON (arXiv 2605.06078, code name MiGPO): an episode advantage plus lambda
          (--step_adv_w) times a segment advantage, milestone-shaped step rewards grouped by segment
  rlvmr   [baseline] RLVMR (arXiv 2507.22844): an episode advantage plus w (--step_adv_w) times the
          meta-reasoning rule rewards of its tags grouped by (task group, tag); needs --prompt rlvmr

Each follows the reference functions (cited per rule below) on each episode's own step order. An estimator
is built as Class(cfg, tasks) (tasks: the run's training tasks) and called as est(rows, episodes) ->
(groups whose every row got advantage 0, groups with a row): it sets row["adv"] on this rank's step rows
(error episodes' rows already left out; a group's episodes are all on one rank). stats() -> a dict merged
into the step record (rank 0's: each rank's estimator sees its own groups).
Rows carry gid (the task group), eid (the episode), t (the step index, hint-prefix steps included), valid
(the reply read and taken), format (the reply's format alone), available (its action admissible), text
(the reply), obs (the raw observation the step acted on), action (the string the env got)
and milestone (a WebShop milestone reached by this step); episodes carry eid, won, n (the hint prefix
length) and task_id. A new estimator is one file with such a class: --advantage file:Class (README "Hack
it").
"""
import collections
import difflib

import torch

from plumbing.webshop import INVALID_PREFIX

MODES = ("mean_norm", "mean_std_norm")


def group_norm(values, keys, mode, singleton, eps=1e-6):
    """Normalise values [N] within the groups keys [N] (hashables). mean_norm: v - mean; mean_std_norm: (v -
    mean) / (std + eps), unbiased std (torch.std). A group of one: singleton "value" keeps it (mean 0, std 1:
    the episode part, core_gigpo.py episode_norm_reward l.225-227), "zero" gives 0 (mean = the value: the step
    part, core_gigpo.py step_norm_reward l.367-369; core_migpo.py segment_norm_reward l.351-353). -> [N]
    float64."""
    values = torch.as_tensor(values, dtype=torch.float64)  # [N]
    out = torch.zeros_like(values)
    members = {}
    for i, k in enumerate(keys):
        members.setdefault(k, []).append(i)
    for idx in members.values():
        v = values[idx]  # [n]
        if len(idx) == 1:
            mean, std = (0.0, 1.0) if singleton == "value" else (v[0].item(), 1.0)
        else:
            mean, std = v.mean().item(), v.std().item()
        out[idx] = v - mean if mode == "mean_norm" else (v - mean) / (std + eps)
    return out


def by_episode(rows):
    """eid -> that episode's row positions in step order (rows come episode by episode, as verl-agent's batch
    comes trajectory by trajectory)."""
    out = {}
    for i, r in enumerate(rows):
        out.setdefault(r["eid"], []).append(i)
    for idx in out.values():
        idx.sort(key=lambda i: rows[i]["t"])
    return out


def row_scores(rows, won, scale, penalty, invalid_key="valid"):
    """The episode part's row score: scale * won minus penalty on an invalid row only (verl-agent's 10 * won
    on the last token, apply_invalid_action_penalty: ray_trainer.py l.201-221); invalid_key: the row's flag
    that decides it ("format": RLVMR's is_action_valid, the format alone). -> [N]"""
    return [scale * won[r["eid"]] - penalty * (not r[invalid_key]) for r in rows]


def episode_part(rows, won, scale, penalty, mode, invalid_key="valid"):
    """A^E, GiGPO's and BEACON's alike: the row scores normalised over every row of the task group
    (cross-step: episode_norm_reward's compute_mean_std_cross_steps=True, core_gigpo.py l.180, l.217-222; a
    group of one row keeps its score). -> [N]"""
    return group_norm(row_scores(rows, won, scale, penalty, invalid_key), [r["gid"] for r in rows], mode,
                      "value")


def discounted_returns(rows, won, scale, penalty, gamma):
    """GiGPO's step return R_t = sum_k>=t gamma^(k-t) r_k with r = scale * won on the episode's last row, else
    0 (core_gigpo.py compute_step_discounted_returns l.87-132), then minus penalty on an invalid row after the
    discounting (ray_trainer.py l.220-221: it does not propagate). A hinted episode's rows are the steps the
    policy played; R_t depends only on the steps after t, so the prefix changes nothing here. -> [N]"""
    out = [0.0] * len(rows)
    for idx in by_episode(rows).values():
        ret = 0.0
        for j, i in enumerate(reversed(idx)):
            ret = (scale * won[rows[i]["eid"]] if j == 0 else 0.0) + gamma * ret
            out[i] = ret - penalty * (not rows[i]["valid"])
    return out


def anchor(obs):
    """The anchor state of an observation: as the env shows it, less the WebShop wrapper's "Invalid action. "
    before an unchanged page (WebShop itself shows just the page: its anchor in the reference)."""
    return obs[len(INVALID_PREFIX):] if obs.startswith(INVALID_PREFIX) else obs


def anchor_groups(rows, thresh=0.0):
    """Each row's step group within its task group: rows whose anchors (raw observations) are equal
    (core_gigpo.py build_step_group l.278-296; steps of one trajectory may share a group, e.g. a place
    revisited). thresh > 0: the similarity mode (l.297-321), greedy in row order: a row joins the first
    cluster whose first member's anchor has difflib ratio >= thresh, else opens one; so it depends on the
    order. -> [N] keys."""
    keys, clusters = [], {}
    for r in rows:
        if thresh <= 0:
            keys.append((r["gid"], anchor(r["obs"])))
            continue
        reps = clusters.setdefault(r["gid"], [])
        k = next((j for j, rep in enumerate(reps)
                  if difflib.SequenceMatcher(None, anchor(r["obs"]), rep).ratio() >= thresh), None)
        if k is None:
            reps.append(anchor(r["obs"]))
            k = len(reps) - 1
        keys.append((r["gid"], k))
    return keys


def count_groups(rows, adv):
    """(groups whose every row has advantage 0, groups with a row)."""
    gids = {}
    for r, a in zip(rows, adv):
        gids[r["gid"]] = gids.get(r["gid"], True) and abs(a) < 1e-12
    return sum(gids.values()), len(gids)


class GiGPO:
    """[baseline] GiGPO: A = A^E + omega * A^S (core_gigpo.py compute_gigpo_outcome_advantage l.138-171). A^E:
    the row scores (row_scores) normalised over every row of the task group (cross-step: episode_norm_reward's
    compute_mean_std_cross_steps=True, l.180, l.217-222). A^S: the discounted returns normalised within anchor
    groups (anchor_groups; a singleton gets 0). Modes mean_norm | mean_std_norm (--adv_mode; the reference's
    ALFWorld script mean_std_norm, WebShop's mean_norm), omega --step_adv_w, gamma --step_gamma, scale and
    penalty --reward_scale and --invalid_penalty (the reference: 10 and 0.1), --similarity_thresh > 0 for the
    similarity mode. With hints (--scheduler g2 --advantage gigpo) the rows are the steps the policy played:
    the replayed prefix makes no row, so it enters no anchor group and no return; a group's R episodes share
    one depth, so their anchors start from the same replayed state."""

    def __init__(self, cfg, tasks=None):
        self.mode, self.omega, self.gamma = cfg.adv_mode, cfg.step_adv_w, cfg.step_gamma
        self.scale, self.penalty, self.thresh = cfg.reward_scale, cfg.invalid_penalty, cfg.similarity_thresh
        self.last = {}

    def __call__(self, rows, episodes):
        won = {e["eid"]: float(e["won"]) for e in episodes}
        a_e = episode_part(rows, won, self.scale, self.penalty, self.mode)  # [N]
        keys = anchor_groups(rows, self.thresh)
        a_s = group_norm(discounted_returns(rows, won, self.scale, self.penalty, self.gamma), keys, self.mode,
                         "zero")  # [N]
        adv = (a_e + self.omega * a_s).tolist()
        for r, a in zip(rows, adv):
            r["adv"] = a
        sizes = list(collections.Counter(keys).values())
        self.last = {"adv_step_groups": len(sizes),
                     "adv_step_group_size": sum(sizes) / len(sizes) if sizes else 0.0,
                     "adv_step_singletons": sum(s == 1 for s in sizes)}
        return count_groups(rows, adv)

    def stats(self):
        return dict(self.last)


# ---------------------------------------------------------------------------------------------------------
# BEACON
# ---------------------------------------------------------------------------------------------------------
def match_milestones(actions, milestones, thresh):
    """Milestone k matches the first action after milestone k-1's whose difflib ratio with it is >= thresh;
    milestones are taken in order; an unmatched one (and every one after it) is -1 (core_migpo.py
    match_milestones l.190-222; SequenceMatcher(None, a, b), no autojunk flag: l.104-117). -> one index per
    milestone."""
    out, k = [], 0
    for t, a in enumerate(actions):
        if k >= len(milestones):
            break
        if difflib.SequenceMatcher(None, a, milestones[k]).ratio() >= thresh:
            out.append(t)
            k += 1
    return out + [-1] * (len(milestones) - len(out))


def segments_from_matches(n, matches, gamma):
    """Segment rewards and ids of n steps (core_migpo.py compute_segment_rewards l.225-267): a matched
    milestone k at step m closes segment k = [previous end + 1, m], each step t in it rewarded gamma^(m - t);
    from the first unmatched milestone k on, every step is in segment k with reward 0; past the last milestone
    when all matched, reward 0 and segment -1. -> ([n] rewards in [0, 1], [n] segment ids)."""
    rewards, seg, prev = [0.0] * n, [-1] * n, -1
    for k, m in enumerate(matches):
        if m == -1:
            for t in range(prev + 1, n):
                seg[t] = k
            break
        for t in range(prev + 1, m + 1):
            seg[t], rewards[t] = k, gamma ** (m - t)
        prev = m
    return rewards, seg


def segments_from_flags(flags, gamma):
    """WebShop: each flagged step closes a segment, whose steps are rewarded gamma^(distance to it); steps
    after the last flag get 0 (core_migpo.py compute_migpo_step_rewards_dynamic l.522-543). A step's segment
    id is the number of flagged steps before it in its episode (build_segment_groups_dynamic l.566-582, here
    on the episode's own step order rather than the batch's). -> ([n] rewards, [n] segment ids)."""
    n, rewards, seg, start = len(flags), [0.0] * len(flags), [0] * len(flags), 0
    for m in [t for t, f in enumerate(flags) if f]:
        for t in range(start, m + 1):
            rewards[t] = gamma ** (m - t)
        start = m + 1
    for t in range(1, n):
        seg[t] = seg[t - 1] + bool(flags[t - 1])
    return rewards, seg


def read_milestones(path, tasks):
    """BEACON's milestone file ({"trajectories": [{"id": "<task_dir>_<trial_dir>", "actions": [...]}]}, its
    migpo/alfworld.json; read as milestone_loader.py reads it) matched to the tasks by trial folder, as the
    authors' expert data is (plumbing.expert_data). -> {task id: actions}; a file that is missing or
    malformed, or names no task of the run, raises a one-line ValueError / FileNotFoundError naming
    --milestones."""
    from plumbing.expert_data import attach_expert_data, read_expert_file
    try:
        entries = read_expert_file(path)
    except (FileNotFoundError, ValueError) as e:  # the loader's one-line errors, under this flag's name
        raise ValueError(str(e).replace("--expert_data", "--milestones", 1)
                         .split(" (the authors' sft_data")[0]) from None
    marked = [{**t, "walkthrough": None} for t in tasks]
    matched, _ = attach_expert_data(marked, entries, "alfworld")
    out = {t["id"]: t["walkthrough"] for t in matched if t["walkthrough"] is not None}
    if not out:
        raise ValueError(f"--milestones {path}: none of its {len(entries)} entries names a training task of "
                         "this run (ids <task_dir>_<trial_dir>, matched by the trial folder)")
    return out


class BEACON:
    """[baseline] BEACON: A = A^E + lambda * A^seg (core_migpo.py compute_migpo_advantage l.371-479). A^E is
    GiGPO's episode part. Step rewards: scale (R_ms; the reference's hard-coded 10 is its outcome scale) times
    the segment rewards, minus penalty on an invalid row (apply_invalid_action_penalty, ray_trainer.py l.220).
    A^seg: those rewards normalised within (task group, segment id) (build_segment_groups l.270-309; a
    singleton gets 0). Segments: ALFWorld from the task's milestones, matched over the episode's actions in
    step order (match_milestones, segments_from_matches); WebShop from the env's milestone flags
    (segments_from_flags; plumbing/milestones.py). Milestones (ALFWorld): --milestones FILE (BEACON's
    alfworld.json format), else each task's expert actions; a task with none gets A^E alone (one warning at
    start-up). Hints: refused at validation (the segments are defined on whole trajectories;
    config.validate)."""

    def __init__(self, cfg, tasks=None):
        self.mode, self.lam, self.gamma = cfg.adv_mode, cfg.step_adv_w, cfg.step_gamma
        self.scale, self.penalty, self.thresh = cfg.reward_scale, cfg.invalid_penalty, cfg.milestone_thresh
        self.flags = cfg.env == "webshop"  # WebShop: the detector's flags; else action matching
        self.milestones, self.last = {}, {}
        if self.flags or tasks is None:
            return
        if cfg.milestones:
            self.milestones = read_milestones(cfg.milestones, tasks)
            source = f"{cfg.milestones}"
        else:
            self.milestones = {t["id"]: list(t["walkthrough"]) for t in tasks if t.get("walkthrough")}
            source = "each task's expert actions" + (f" (--expert_data {cfg.expert_data})" if cfg.expert_data
                                                     else " (its walkthrough)")
        none = len(tasks) - sum(t["id"] in self.milestones for t in tasks)
        print(f"[beacon] milestones from {source}: {len(tasks) - none} of {len(tasks)} training tasks")
        if none:
            print(f"[beacon] warning: {none} training task(s) have no milestones; their rows get A^E alone")

    def __call__(self, rows, episodes):
        won = {e["eid"]: float(e["won"]) for e in episodes}
        task = {e["eid"]: e["task_id"] for e in episodes}
        a_e = episode_part(rows, won, self.scale, self.penalty, self.mode)  # [N]
        reward, seg, shaped, reached = [0.0] * len(rows), [None] * len(rows), [False] * len(rows), 0
        for eid, idx in by_episode(rows).items():
            if self.flags:
                flags = [rows[i].get("milestone", False) for i in idx]
                rw, sg = segments_from_flags(flags, self.gamma)
                reached += sum(map(bool, flags))
            elif task[eid] in self.milestones:
                matches = match_milestones([rows[i]["action"] for i in idx], self.milestones[task[eid]],
                                           self.thresh)
                rw, sg = segments_from_matches(len(idx), matches, self.gamma)
                reached += sum(m >= 0 for m in matches)
            else:
                continue  # no milestones: A^E alone
            for i, x, k in zip(idx, rw, sg):
                reward[i] = self.scale * x - self.penalty * (not rows[i]["valid"])
                seg[i], shaped[i] = k, True
        keys = [(r["gid"], k) for r, k in zip(rows, seg)]
        a_seg = group_norm(reward, keys, self.mode, "zero") * torch.tensor(shaped, dtype=torch.float64)  # [N]
        adv = (a_e + self.lam * a_seg).tolist()
        for r, a in zip(rows, adv):
            r["adv"] = a
        self.last = {"adv_shaped_rows": sum(shaped), "adv_milestones": reached,
                     "adv_segments": len({k for k, s in zip(keys, shaped) if s})}
        return count_groups(rows, adv)

    def stats(self):
        return dict(self.last)


# ---------------------------------------------------------------------------------------------------------
# RLVMR
# ---------------------------------------------------------------------------------------------------------
MR_REWARD = 1.0  # planning_reward, exploration_reward, reflection_reward: 1.0 each (ppo_trainer.yaml)


def mr_rewards(steps, won):
    """RLVMR's rule rewards of one episode's rows in step order (core_rlvmr.py
    process_trajectory_rlvmr_rewards l.75-146) -> ([n] tags, [n] rewards). A format-invalid row: tag "none",
    0. Else its tag (formats.tag_of: planning, explore, reflection by substring, in that order; monitor is
    "none") and reward: planning MR_REWARD iff the episode is won; explore iff its action list (formats.
    action_list) differs from that of every earlier format-valid row; reflection iff the previous row was
    format-invalid or its action not admissible and the action lists differ (the first row: no previous row,
    an invalid "" one, so a reflection there is rewarded)."""
    from variants.formats import action_list, tag_of
    tags, rewards = [], []
    for j, r in enumerate(steps):
        tag, now, rw = tag_of(r["text"]) if r["format"] else "none", action_list(r["text"]), 0.0
        if tag == "planning":
            rw = MR_REWARD * bool(won)
        elif tag == "explore":
            rw = MR_REWARD * all(action_list(p["text"]) != now for p in steps[:j] if p["format"])
        elif tag == "reflection":
            prev = steps[j - 1] if j else None
            prev_ok = prev is not None and prev["format"] and prev["available"]
            rw = MR_REWARD * (not prev_ok and (action_list(prev["text"]) if prev else "") != now)
        tags.append(tag)
        rewards.append(rw)
    return tags, rewards


class RLVMR:
    """[baseline] RLVMR: A = A^traj + w * A^MR (core_rlvmr.py compute_rlvmr_outcome_advantage l.7-40; the
    RL script's w = 1.0, --step_adv_w), or --rlvmr_alpha a in (0, 1): the paper's convex a * A^traj + (1 - a)
    * A^MR (its Eq. 4, a = 0.5). A^traj: the row scores --reward_scale * won minus --invalid_penalty on a
    format-invalid row (the reference's is_action_valid: the format alone) normalised over every row of the
    task group (episode_norm_reward l.42-73, cross-step; a singleton keeps its score). A^MR: mr_rewards
    normalised within (task group, tag) (step_norm_reward_by_tag l.155-196): a singleton keeps its raw
    reward (mean 0, std 1), unlike GiGPO's and BEACON's step parts. Modes --adv_mode (the yaml's and the
    script's mean_std_norm). Rows after a hint prefix are the steps the policy played; the first of them has
    no previous row."""

    def __init__(self, cfg, tasks=None):
        self.mode, self.w, self.alpha = cfg.adv_mode, cfg.step_adv_w, cfg.rlvmr_alpha
        self.scale, self.penalty, self.last = cfg.reward_scale, cfg.invalid_penalty, {}

    def __call__(self, rows, episodes):
        won = {e["eid"]: float(e["won"]) for e in episodes}
        a_traj = episode_part(rows, won, self.scale, self.penalty, self.mode, "format")  # [N]
        tags, reward = [None] * len(rows), [0.0] * len(rows)
        for eid, idx in by_episode(rows).items():
            for i, tag, rw in zip(idx, *mr_rewards([rows[i] for i in idx], won[eid])):
                tags[i], reward[i] = tag, rw
        a_mr = group_norm(reward, [(r["gid"], t) for r, t in zip(rows, tags)], self.mode, "value")  # [N]
        a = a_traj + self.w * a_mr if self.alpha == 0 else self.alpha * a_traj + (1 - self.alpha) * a_mr
        adv = a.tolist()
        for r, x in zip(rows, adv):
            r["adv"] = x
        counts = collections.Counter(tags)
        self.last = {**{f"adv_tag_{t}": counts[t] / max(1, len(rows)) for t in ("planning", "explore",
                                                                               "reflection", "none")},
                     "adv_mr_reward": sum(reward) / max(1, len(rows))}
        return count_groups(rows, adv)

    def stats(self):
        return dict(self.last)


REGISTRY = {"gigpo": GiGPO, "beacon": BEACON, "rlvmr": RLVMR}
