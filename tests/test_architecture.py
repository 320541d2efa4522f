"""The package's import graph: imports only go down the layers, and no module takes part
in an import cycle (lazy imports inside functions included).

Layers, lowest first (docs/ARCHITECTURE.md, "Layers"): a module may import modules of
its own package and of packages in lower layers, never of a higher one.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "drubric_jax"
ENTRY, CONFIGS = ROOT.parent / "experiments", ROOT.parent / "configs"

# Top-level packages and modules of drubric_jax, by layer (lowest first).
LAYERS = [
    {"types"},
    {"text", "data", "checks"},
    {"parallel"},
    {"models"},
    {"sampling"},
    {"rl"},
    {"evaluator"},
    {"config_check"},
    {"rounds"},
    {"memory"},
    {"evaluation"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _modules(root: pathlib.Path = ROOT) -> dict:
    """{dotted module name: path} of every module under `root` (default drubric_jax/)."""
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict:
    """{module: set of drubric_jax modules it imports anywhere in its source}."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name.startswith("drubric_jax")}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolved against the importing package
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if not base.startswith("drubric_jax"):
                    continue
                for a in node.names:  # `from pkg import submodule` is an edge to it
                    edges.add(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
        graph[name] = {e for e in edges if e in mods and e != name}
    return graph


def unresolved_imports() -> list:
    """(module, import) pairs whose drubric_jax target is neither a module nor a name the
    package's __init__ defines: a lazy import of a moved module is found here too."""
    mods = _modules()
    out = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("drubric_jax"):
                if node.module not in mods:
                    out.append((name, node.module))
                    continue
                init = mods[node.module]
                defined = init.read_text(encoding="utf-8") if init.name == "__init__.py" else ""
                for a in node.names:
                    if f"{node.module}.{a.name}" not in mods and init.name == "__init__.py" \
                            and a.name not in defined:
                        out.append((name, f"{node.module}.{a.name}"))
            elif isinstance(node, ast.Import):
                out += [(name, a.name) for a in node.names
                        if a.name.startswith("drubric_jax") and a.name not in mods]
    return out


def test_every_import_of_the_package_resolves():
    assert not unresolved_imports(), unresolved_imports()


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_top_level_name_has_a_layer():
    tops = {_top(m) for m in _modules()} - {""}
    assert tops <= set(RANK), f"not in LAYERS: {sorted(tops - set(RANK))}"


def test_imports_only_go_down_the_layers():
    upward = [(m, e) for m, edges in import_graph().items() for e in edges
              if _top(m) and _top(e) and _top(m) != _top(e) and RANK[_top(e)] > RANK[_top(m)]]
    assert not upward, "upward imports:\n" + "\n".join(f"  {m} -> {e}" for m, e in upward)


def find_cycle(graph: dict):
    """One import cycle of `graph` as a list of modules, or None (depth-first search)."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for e in sorted(graph.get(m, ())):
            if state.get(e) == "open":
                return stack[stack.index(e):] + [e]
            if e not in state:
                found = visit(e)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def top_graph() -> dict:
    """{module of configs/ or experiments/: set of modules of configs/, experiments/ or
    drubric_jax it imports anywhere in its source}; drubric_jax's modules map to the
    configs/ and experiments/ modules they import (none, by the rule below)."""
    mods = {**_modules(), **_modules(ENTRY), **_modules(CONFIGS)}
    roots = ("configs", "experiments", "drubric_jax")
    graph = {}
    for name, path in mods.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                edges |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods
                          else node.module for a in node.names}
        graph[name] = {e for e in edges if e in mods and e != name and e.startswith(roots)}
    return graph


def test_configs_and_experiments_sit_above_the_package_without_cycles():
    """configs/ and experiments/ follow the package's rules: no import cycle among them
    (configs/base.py and configs/smollm2_cpu.py once imported each other), and the package
    imports neither (it is the layer below both)."""
    graph = top_graph()
    tops = {m: e for m, e in graph.items() if not m.startswith("drubric_jax")}
    cycle = find_cycle(tops)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    up = [(m, e) for m, edges in graph.items() if m.startswith("drubric_jax")
          for e in edges if not e.startswith("drubric_jax")]
    assert not up, f"the package imports configs/ or experiments/: {up}"


def test_a_tiny_checks_world_config_is_the_same_by_every_route():
    """`world=checks` on the tiny model gives one generator setting whichever config file
    built it (configs/checks_world.py applies it, not each route)."""
    from configs import ablation, checks_policy, smollm2_cpu

    got = {name: (c.generator.max_items, c.generator.max_new_tokens, c.policy.max_new_tokens)
           for name, c in {"smollm2_cpu": smollm2_cpu.get_config("tiny,world=checks"),
                           "checks_policy": checks_policy.get_config("tiny"),
                           "ablation": ablation.get_config("tiny,world=checks")}.items()}
    assert len(set(got.values())) == 1, got


def test_the_checks_see_an_upward_import_and_a_cycle():
    """The two checks on a toy graph: each fires on what it must catch."""
    toy = {"drubric_jax.a.x": {"drubric_jax.a.y"}, "drubric_jax.a.y": {"drubric_jax.a.x"}}
    assert find_cycle(toy) == ["drubric_jax.a.x", "drubric_jax.a.y", "drubric_jax.a.x"]
    assert find_cycle({"drubric_jax.a.x": {"drubric_jax.a.y"}}) is None
    assert RANK["models"] < RANK["sampling"] < RANK["rounds"]


@pytest.mark.parametrize("limit_lines, limit_class", [(400, 200)])
def test_files_and_classes_stay_small(limit_lines, limit_class):
    """One job per file: no module over 400 lines, no class over 200."""
    long_files, long_classes = [], []
    for name, path in {**_modules(), **_modules(ENTRY), **_modules(CONFIGS)}.items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > limit_lines:
            long_files.append((name, text.count("\n")))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > limit_class:
                long_classes.append((f"{name}.{node.name}", node.end_lineno - node.lineno + 1))
    assert not long_files, f"files over {limit_lines} lines: {long_files}"
    assert not long_classes, f"classes over {limit_class} lines: {long_classes}"


def test_layers_below_rounds_never_take_the_run_config():
    """The run config is read once (`rounds.settings`): no module below `rounds/` other
    than the validation (`config_check`) imports ml_collections or has a `config`
    parameter, so none takes the ConfigDict (`rounds.settings.read` hands them values)."""
    below = {name for name, rank in RANK.items() if rank < RANK["rounds"]} - {"config_check"}
    offenders, params = [], []
    for m, path in _modules().items():
        if _top(m) not in below:
            continue
        text = path.read_text(encoding="utf-8")
        if "ml_collections" in text:
            offenders.append(m)
        # Nor a parameter named `config` (a ConfigDict passed duck-typed).
        params += [(m, node.name) for node in ast.walk(ast.parse(text))
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and "config" in {a.arg for a in node.args.args + node.args.kwonlyargs}]
    assert not offenders, offenders
    assert not params, params


def test_true_check_rewards_agree():
    """rounds.settings names the true-check rewards without importing the checkers; the
    names are checks.gold's."""
    from drubric_jax.checks.gold import TRUE_CHECK_REWARDS
    from drubric_jax.rounds import settings

    assert settings.TRUE_CHECK_REWARDS == TRUE_CHECK_REWARDS
