"""Plug-ins: the one path every `file:Class` of a user's goes through (--scheduler, --hint_source, --env,
--loss_terms, --advantage, --task_sampler, --reward), and the check of what each kind must have, at start-up.

Contract. plugin(kind, spec) -> the class `spec` names: a registered name of that kind (resolved by the
caller) or "module:Class" / "file.py:Class" (a file beside train.py or on PYTHONPATH). check_class(cls, kind,
spec) raises one ValueError line, naming the flag, the class, the method and the signature it must accept,
when a method is missing or cannot be called as the code calls it; config.validate runs it for every plug-in
flag before any model loads. plugin_stats(named) -> {name: stats()} of the plug-ins whose stats() says
something: train.py merges it into the step record.
"""
import inspect

from plumbing.classes import load_class

# kind -> (its flag, {method: the arguments the code passes, self aside}); "__init__": the constructor's
INTERFACES = {
    "rule": ("--scheduler", {"__init__": ("cfg", "task_ids", "lengths", "seed", "tok"),
                             "depths": ("tasks", "step", "probe"), "update": ("task_ids", "p_hat", "flags"),
                             "set_length": ("task_id", "L"), "stats": (), "state_dict": (),
                             "load_state_dict": ("sd",)}),
    "hints": ("--hint_source", {"__init__": ("cfg", "tasks"), "hint": ("task",), "observe": ("episodes",),
                                "state_dict": (), "load_state_dict": ("sd",)}),
    "env": ("--env", {"env_spec": ("cfg",), "make_env": ("spec",), "tasks": ("cfg", "split", "verbose"),
                      "split_names": ("cfg",), "stats": ("games",), "reset": ("gamefile", "prefix"),
                      "step": ("ep", "action")}),
    "loss": ("--loss_terms", {"__init__": ("cfg",), "__call__": ("mb",),
                              "finish": ("sums", "maxima", "n_mb", "tokens")}),
    "advantage": ("--advantage", {"__init__": ("cfg", "tasks"), "__call__": ("rows", "episodes"),
                                  "stats": ()}),
    "task_sampler": ("--task_sampler", {"__init__": ("cfg", "tasks"), "batch": ("step",),
                                        "observe": ("task_ids", "p_hat"), "stats": (), "state_dict": (),
                                        "load_state_dict": ("sd",)}),
    "reward": ("--reward", {"__init__": ("cfg",), "episode": ("ep",), "rows": ("ep", "reward"), "stats": ()}),
}


def plugin(kind, spec):
    """'module:Class' or 'file.py:Class' -> the class, checked against its kind's interface (one-line
    ValueError naming the flag otherwise)."""
    flag = INTERFACES[kind][0]
    module, _, name = spec.partition(":")
    module = module[:-3] if module.endswith(".py") else module  # "my_rule.py:Rule" names the file
    cls = load_class(f"{module}:{name}", f"{flag} {spec}")
    return check_class(cls, kind, spec)


def check_class(cls, kind, spec):
    """cls, if it has every method of its kind's interface, each callable with the arguments the code passes;
    else one ValueError line: the flag, the class, the method and the signature it must accept."""
    flag, methods = INTERFACES[kind]
    if not inspect.isclass(cls):  # a registered factory (variants/losses.py's sft): built by its own code
        return cls
    for method, params in methods.items():
        raw, fn = inspect.getattr_static(cls, method, None), getattr(cls, method, None)
        want = f"{cls.__name__}.{method}({', '.join(('self',) + params if method != '__init__' else params)})"
        if raw is None or not callable(fn):
            raise ValueError(f"{flag} {spec}: {cls.__name__} has no method {method}; it must be {want}")
        takes_self = not isinstance(raw, (staticmethod, classmethod))
        try:
            inspect.signature(fn).bind(*[None] * (len(params) + takes_self))
        except TypeError:
            got = f"{cls.__name__}.{method}{inspect.signature(fn)}"
            raise ValueError(f"{flag} {spec}: {got} cannot be called as {want}") from None
        except ValueError:  # a builtin without a signature (object.__init__ of a class with no __init__)
            continue
    return cls


def plugin_stats(named):
    """{name: plug-in} -> {name: its stats()} for those that have a stats() saying something."""
    out = {}
    for name, obj in named.items():
        stats = obj.stats() if callable(getattr(obj, "stats", None)) else {}
        if stats:
            out[name] = stats
    return out


# variants/<kind>.py -> its plug-in kind
PLUGIN_KINDS = {"rules": "rule", "hints": "hints", "losses": "loss", "advantages": "advantage"}


def variant(kind, name):
    """The object class that the config names for a fork point: `name` in the REGISTRY dict of
    variants/<kind>.py (rules, hints, losses, players), or 'module:Class' / 'file.py:Class', a file of your
    own importable from the working directory, checked against its kind's interface (plumbing/plugins.py).
    An unknown name raises ValueError in one line."""
    if ":" in name:
        return plugin(PLUGIN_KINDS[kind], name)
    registry = variant_registry(kind)
    if name not in registry:
        label = {"rules": "scheduler"}.get(kind, f"{kind} variant")
        raise ValueError(f"unknown {label} {name!r} (have: {', '.join(registry)})")
    return registry[name]


def check_plugins(cfg):
    """Every plug-in's file:Class imported and checked against its kind's interface; --loss_terms' names
    known; --task_sampler and --reward their default or file:Class. One ValueError line otherwise."""
    names = {"rule": [cfg.scheduler], "hints": [cfg.hint_source], "env": [cfg.env],
             "loss": cfg.loss_terms.split(","), "advantage": [cfg.advantage],
             "task_sampler": [cfg.task_sampler], "reward": [cfg.reward]}
    for kind, specs in names.items():
        for spec in [s for s in specs if ":" in s]:
            plugin(kind, spec)
    for name in [n for n in cfg.loss_terms.split(",") if n and ":" not in n]:  # a registered term's name
        try:
            variant("losses", name)
        except ValueError as e:
            raise ValueError(f"--loss_terms {e}") from None
    for flag, default in (("task_sampler", "order"), ("reward", "paper")):
        if (value := getattr(cfg, flag)) != default and ":" not in value:
            raise ValueError(f"--{flag} {value!r}: expected {default} or file:Class (README \"Hack it\")")


def variant_registry(kind):
    """name -> class of every variant of a kind (variants/<kind>.py's REGISTRY)."""
    import importlib
    return importlib.import_module(f"variants.{kind}").REGISTRY
