"""Fake `web_agent_site.envs.web_agent_text_env` (see ../../README.md): the documented interface only."""
import random

import envs as g2  # this repo's envs.py (on sys.path in the tests): catalogue, pages, reward


class SimServer:
    def __init__(self, num_products=None):
        self.site = g2.LiteSite(0, 300)
        goals = [dict(gl, goal_options=list(gl["goal_options"].values())) for gl in self.site.goals]
        random.seed(233)  # like WebShop: the goal order depends only on the number of goals
        random.shuffle(goals)
        self.goals = goals


class WebAgentTextEnv:
    def __init__(self, observation_mode="html", file_path=None, server=None, **kwargs):
        assert observation_mode == "text", "the fake renders text mode only"
        self.server = server or SimServer(kwargs.get("num_products"))
        self.kwargs, self.steps_taken = kwargs, 0

    def reset(self, session=None, instruction_text=None):
        self.goal = self.server.goals[session if isinstance(session, int) else random.randrange(len(self.server.goals))]
        self.state, self.steps_taken = {"kind": "search"}, 0
        return self.observation, None

    @property
    def observation(self):
        text = self.server.site.view(self.state)[0]
        head = ["WebShop"] if self.state["kind"] == "search" else []
        return " [SEP] ".join(head + ["Instruction:", self.goal["instruction_text"], text])

    def get_available_actions(self):
        _, has_search, clicks = self.server.site.view(self.state)
        return {"has_search_bar": has_search, "clickables": clicks}

    def step(self, action):
        self.steps_taken += 1
        act = g2.parse_webshop_action(action)
        av = self.get_available_actions()
        if act is None or (act[0] == "search" and not av["has_search_bar"]) or \
                (act[0] == "click" and (act[1] not in av["clickables"] or act[1] == "search")):
            return self.observation, 0.0, False, None  # WebShop: an invalid action is a no-op
        if act == ("click", "buy now"):
            product = self.server.site.products[self.state["asin"]]
            r = g2.webshop_reward(self.goal, product, list(self.state["options"].values()))[0]
            self.last_reward = r
            return "Thank you for shopping with us!", r, True, None
        self.state = self.server.site.move(self.state, *act)
        return self.observation, 0.0, False, None


