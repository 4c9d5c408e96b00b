"""Fake `web_agent_site.envs.web_agent_text_env` (see ../../README.md): the documented interface only.
Like WebShop, the page state of an episode lives in the shared server under the key session_prefix + session,
goal price caps are drawn from the global `random` before the goal list is shuffled with seed 233, and an
invalid action is a no-op."""
import random

import envs as g2  # this repo's envs.py (on sys.path in the tests): catalogue, pages, reward


class SimServer:
    def __init__(self, num_products=None):
        self.site = g2.LiteSite(0, 520)
        goals = []
        for gl in self.site.goals:
            cap = gl["price_upper"] + 10 * random.randint(0, 3)  # global random, unseeded here, as in WebShop
            goals.append(dict(gl, goal_options=list(gl["goal_options"].values()), price_upper=cap,
                              instruction_text=gl["instruction_text"].rsplit(", and price", 1)[0] +
                              f", and price lower than {cap:.2f} dollars"))
        random.seed(233)  # like WebShop: the goal order depends only on the number of goals
        random.shuffle(goals)
        self.goals, self.user_sessions = goals, {}


class WebAgentTextEnv:
    def __init__(self, observation_mode="html", file_path=None, server=None, session_prefix=None, **kwargs):
        assert observation_mode == "text", "the fake renders text mode only"
        self.server = server or SimServer(kwargs.get("num_products"))
        self.session_prefix, self.kwargs = session_prefix or "", kwargs

    def reset(self, session=None, instruction_text=None):
        idx = session if isinstance(session, int) else random.randrange(len(self.server.goals))
        self.session = f"{self.session_prefix}{idx}"
        self.server.user_sessions[self.session] = {"goal": self.server.goals[idx], "state": {"kind": "search"}}
        return self.observation, None

    @property
    def _s(self):
        return self.server.user_sessions[self.session]

    @property
    def observation(self):
        text = self.server.site.view(self._s["state"])[0]
        head = ["WebShop"] if self._s["state"]["kind"] == "search" else []
        return " [SEP] ".join(head + ["Instruction:", self._s["goal"]["instruction_text"], text])

    def get_available_actions(self):
        _, has_search, clicks = self.server.site.view(self._s["state"])
        return {"has_search_bar": has_search, "clickables": clicks}

    def step(self, action):
        act = g2.parse_webshop_action(action)
        av = self.get_available_actions()
        if act is None or (act[0] == "search" and not av["has_search_bar"]) or \
                (act[0] == "click" and (act[1] not in av["clickables"] or act[1] == "search")):
            return self.observation, 0.0, False, None  # WebShop: an invalid action is a no-op
        st = self._s["state"]
        if act == ("click", "buy now"):
            product = self.server.site.products[st["asin"]]
            self.last_reward = g2.webshop_reward(self._s["goal"], product, list(st["options"].values()))[0]
            return "Thank you for shopping with us!", self.last_reward, True, None
        self._s["state"] = self.server.site.move(st, *act)
        return self.observation, 0.0, False, None
