"""The repository's shape: no import cycle among the top-level modules, no path that leaves the repository, and
train.py short enough to read top to bottom."""
import ast
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = sorted(f[:-3] for f in os.listdir(ROOT) if f.endswith(".py"))


def import_graph(root=ROOT, modules=MODULES):
    """{module: set of top-level modules it imports}, from every import statement in the file (those inside
    functions too: a lazy import hides a cycle, it does not remove it)."""
    graph = {}
    for m in modules:
        tree = ast.parse(open(os.path.join(root, m + ".py")).read())
        deps = set()
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            deps |= {n.split(".")[0] for n in names} & set(modules)
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
    assert {"train", "envs", "gamegen", "webshop", "config"} <= set(MODULES)
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


def test_train_py_reads_top_to_bottom_in_450_lines():
    n = sum(1 for _ in open(os.path.join(ROOT, "train.py")))
    assert n <= 450, f"train.py has {n} lines (keep it <= 450: move helpers into the modules it calls)"
