"""[released] The authors' reply rule (the plain one is rollout.Reply): how a reply is read and what an
episode earns, each part set by its flag. Built once at setup by rollout.make_reply through config.variant
when a flag differs from rollout.PLAIN_REPLY (config/released.py and config/paper.py set the projection's two:
--preset paper runs it).

    --parse_lower       read the lower-cased reply
    --parse_think       a reply without <think>...</think>, or with a CJK character, is played but invalid
    --reward_scale S    reward = S * won - P * invalid steps ...
    --invalid_penalty P
    --adv_level traj | step   ... the same on every step row (traj) | won minus the row's own penalty (step)
"""
import re

from grpo import step_rewards
from rollout import parse_action

CJK = re.compile(r"[\u4e00-\u9fff]")


class Authors:
    """The authors' projection and rewards (rollout.Reply documents the interface)."""

    def __init__(self, cfg):
        self.lower, self.think = cfg.parse_lower, cfg.parse_think
        self.scale, self.penalty, self.adv_level = cfg.reward_scale, cfg.invalid_penalty, cfg.adv_level

    def read(self, text, finished):
        """-> (the action to play or None, the reply counts as valid). --parse_lower reads the lower-cased
        reply; --parse_think counts a reply without <think>...</think> or with a CJK character invalid, though
        its action is played [the authors' projection:
        agent_system/environments/env_package/webshop/projection.py, and verl-agent's alfworld_projection]."""
        if self.lower and isinstance(text, str):
            text = text.lower()
        action = parse_action(text, finished)
        ok = action is not None
        if ok and self.think:
            ok = "<think>" in text and "</think>" in text and not CJK.search(text)
        return action, ok

    def reward(self, won, n_invalid):  # reward_scale * won - invalid_penalty * invalid steps
        return self.scale * float(won) - self.penalty * n_invalid

    def row_rewards(self, won, invalid):  # traj: the episode's reward; step: won minus this row's penalty
        return step_rewards(won, invalid, self.scale, self.penalty, self.adv_level)


REGISTRY = {"authors": Authors}
