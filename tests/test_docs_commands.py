"""Every command of README.md and docs/*.md that runs an entry point of this repository
names a module, flags and config fields that exist.

A command is `python -m experiments.X ...` (any interpreter path: `python3`,
`.venv/bin/python`, `/tmp/tvenv/bin/python`) in a fenced or indented code block, or in an
inline `code` span of the prose (a span may wrap over lines), with lines continued by a
trailing backslash joined. It ends at the end of its line or span, at a shell operator
(`;`, `&&`, `|`, `>`), at an unquoted `#` comment, or at the closing quote of a string it
sits in (`--command=".venv/bin/python -m ..."`). For each command:
(a) experiments/X.py exists;
(b) every `--flag`, `--flag=value`, `--flag value` and `--noflag` is one that X.py (or an
    `experiments` module it imports) defines with absl, or one of absl's own; an enum flag's
    value is one of its choices;
(c) `--config=configs/F.py[:switches]` loads: F's get_config(switches) runs (as
    ml_collections' config_flags calls it), each `--config.a.b=v` override names an
    existing field, and for `experiments.sweep` every override of F's get_sweep() does too.

The flags are read from the modules' source (`flags.DEFINE_*` calls, parsed with `ast`), not
by importing the modules: several entry points define the same flag names (`config`,
`workdir`), and absl refuses a second definition in one process. A DEFINE call whose name
is not a literal fails the test instead of being skipped. Nothing is run; the whole file
takes seconds (the config files import a little of drubric_jax).
"""
import ast
import functools
import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))

# `python -m experiments.X`, whatever the interpreter's path.
COMMAND = re.compile(r"(?<![\w./~$-])(?:[\w./~$-]*/)?python[\d.]*\s+-m\s+experiments\.(\w+)")
SHELL_OPERATORS = {";", "&&", "||", "|", ">", ">>", "<", "&", "(", ")", ";;"}
# Flags absl itself defines for every program (absl.app and absl.logging at import).
ABSL_MODULES = ("absl.app", "absl.logging", "absl.flags")
BOOL_DEFINES = {"DEFINE_bool", "DEFINE_boolean"}


# ----- finding the commands -----

def _join_continued(lines):
    """[(first line number, text)] with lines ending in a backslash joined to the next."""
    out, buf, start = [], [], None
    for number, line in lines:
        if start is None:
            start = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            buf.append(stripped[:-1])
            continue
        buf.append(line)
        out.append((start, " ".join(buf)))
        buf, start = [], None
    if buf:
        out.append((start, " ".join(buf)))
    return out


def _split_blocks(text):
    """The file's code lines (fenced blocks, and indented blocks after a blank line) as
    [(line number, text)] runs, and its prose paragraphs as [(line number, text)] runs."""
    code_runs, prose_runs = [], []
    code, prose = [], []
    fenced, previous_blank = False, True
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            if fenced:
                code_runs.append(code)
                code = []
            else:
                prose_runs.append(prose)
                prose = []
            fenced = not fenced
            previous_blank = False
            continue
        if fenced:
            code.append((number, line))
            continue
        blank = not line.strip()
        indented = line.startswith("    ") and not line.lstrip().startswith(("- ", "* ", "| "))
        if indented and (previous_blank or (code and code[-1][0] == number - 1)):
            if prose:
                prose_runs.append(prose)
                prose = []
            code.append((number, line))
        else:
            if code:
                code_runs.append(code)
                code = []
            if blank:
                if prose:
                    prose_runs.append(prose)
                    prose = []
            else:
                prose.append((number, line))
        previous_blank = blank
    for run, runs in ((code, code_runs), (prose, prose_runs)):
        if run:
            runs.append(run)
    return code_runs, prose_runs


def _inline_spans(paragraph):
    """[(line number, text)] of the inline code spans of a prose paragraph (a span may wrap
    over lines; its newlines become spaces, a backslash before one is dropped)."""
    joined, starts = "", []
    for number, line in paragraph:
        starts.append((len(joined), number))
        joined += line + "\n"
    spans = []
    for m in re.finditer(r"(`+)(.+?)\1", joined, flags=re.S):
        line_number = max(n for offset, n in starts if offset <= m.start())
        body = re.sub(r"\\\n", " ", m.group(2)).replace("\n", " ")
        spans.append((line_number, body))
    return spans


def _strip_comment(text):
    """`text` up to its first unquoted `#` that starts a word (a shell comment)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i]
    return text


def _commands_in(text, line_number):
    """[(line number, module, argument tokens)] of the commands in one logical line."""
    found = []
    for m in COMMAND.finditer(text):
        before = text[:m.start()]
        rest = text[m.end():]
        # Inside a double-quoted string (e.g. ssh --command="..."): stop at its end.
        if before.count('"') % 2 == 1 and '"' in rest:
            rest = rest[:rest.index('"')]
        nxt = COMMAND.search(rest)
        if nxt:  # two commands on one line: each gets its own
            rest = rest[:nxt.start()]
        rest = _strip_comment(rest)
        try:
            lexer = shlex.shlex(rest, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = ""
            tokens = list(lexer)
        except ValueError as e:
            found.append((line_number, m.group(1), e))
            continue
        args = []
        for token in tokens:
            if token in SHELL_OPERATORS or token.startswith("#"):
                break
            args.append(token)
        found.append((line_number, m.group(1), args))
    return found


def find_commands(path):
    """[(line number, module, argument tokens or the ValueError of tokenising)]."""
    code_runs, prose_runs = _split_blocks(path.read_text(encoding="utf-8"))
    out = []
    for run in code_runs:
        for number, line in _join_continued(run):
            if "`" in line:  # an indented list paragraph with inline code, not a code block
                out += [c for n, span in _inline_spans([(number, line)])
                        for c in _commands_in(span, n)]
            else:
                out += _commands_in(line, number)
    for paragraph in prose_runs:
        for number, span in _inline_spans(paragraph):
            out += _commands_in(span, number)
    return sorted(out, key=lambda c: c[0])


def _all_commands():
    params = []
    for path in DOC_FILES:
        rel = path.relative_to(REPO).as_posix()
        for number, module, args in find_commands(path):
            params.append(pytest.param(rel, number, module, args, id=f"{rel}:{number}"))
    return params


COMMANDS = _all_commands()


# ----- what the modules define -----

def _literal(node, what, where):
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise AssertionError(f"{where}: {what} is not a literal ({ast.dump(node)}); "
                             "the test cannot read it") from None


@functools.lru_cache(maxsize=None)
def module_flags(module):
    """{flag name: (DEFINE kind, enum choices or None)} of experiments/<module>.py and of the
    `experiments` modules it imports."""
    path = REPO / "experiments" / f"{module}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    defined = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = ([f"{node.module}.{a.name}" for a in node.names]
                     if node.module == "experiments" else [node.module])
            for name in names:
                sub = name.split(".", 1)[1] if name.startswith("experiments.") else None
                if sub and (REPO / "experiments" / f"{sub}.py").exists():
                    defined.update(module_flags(sub))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("experiments."):
                    defined.update(module_flags(a.name.split(".", 1)[1]))
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr.startswith("DEFINE_")):
            continue
        where = f"experiments/{module}.py:{node.lineno}"
        kind = node.func.attr
        keywords = {k.arg: k.value for k in node.keywords}
        name_node = node.args[0] if node.args else keywords.get("name")
        assert name_node is not None, f"{where}: {kind} without a flag name"
        name = _literal(name_node, "the flag name", where)
        choices = None
        if kind == "DEFINE_enum":
            enum_node = node.args[2] if len(node.args) > 2 else keywords.get("enum_values")
            choices = tuple(_literal(enum_node, "the enum values", where))
        defined[name] = (kind, choices)
    return defined


@functools.lru_cache(maxsize=None)
def absl_flags():
    """{name: is boolean} of the flags absl's own modules define."""
    import absl.app  # noqa: F401  (defines its flags at import)
    import absl.logging  # noqa: F401
    from absl import flags
    by_module = flags.FLAGS.flags_by_module_dict()
    out = {"flagfile": False, "undefok": False}
    for module in ABSL_MODULES:
        for flag in by_module.get(module, []):
            out[flag.name] = flag.boolean
            if flag.short_name:
                out[flag.short_name] = flag.boolean
    return out


def _load_config_module(path):
    if path.parent == REPO / "configs":
        return importlib.import_module(f"configs.{path.stem}")
    spec = importlib.util.spec_from_file_location(f"doc_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def load_config(argument):
    """(the config file's module, get_config's result) for a `--config=` value, loaded as
    ml_collections' config_flags loads it: get_config(switches) after ':', else get_config()."""
    path, *switches = argument.split(":", 1)
    file = REPO / path
    assert file.is_file(), f"config file {path} does not exist"
    module = _load_config_module(file)
    return module, module.get_config(*switches)


def has_field(config, dotted):
    """Whether `dotted` ("a.b.c") names a field of the (nested) ConfigDict."""
    node = config
    for part in dotted.split("."):
        if hasattr(node, "keys") and part in node.keys():
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


# ----- the checks -----

def parse_flags(args, defined, where):
    """[(name, value or None, negated)] of the command's flags; a flag given as
    `--name value` takes the next token unless it is boolean."""
    out, i = [], 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            break  # absl: the rest are positional arguments
        if not token.startswith("-") or token == "-":
            continue  # a positional argument
        body = token.lstrip("-")
        if "=" in body:
            name, value = body.split("=", 1)
            out.append((name, value, False))
            continue
        name = body
        negated = False
        if name not in defined and name.startswith("no") and name[2:] in defined:
            name, negated = name[2:], True
        kind = defined.get(name, ("", None))[0]
        if negated or kind in BOOL_DEFINES or kind == "absl_bool":
            out.append((name, None, negated))
        elif name.startswith("config.") or kind:
            assert i < len(args), f"{where}: --{name} has no value"
            out.append((name, args[i], False))
            i += 1
        else:
            out.append((name, None, False))
    return out


def test_the_docs_have_commands():
    """The extraction finds the commands (a broken pattern would make every check vacuous)."""
    modules = {c.values[2] for c in COMMANDS}
    assert len(COMMANDS) >= 30 and {"run", "make_checks_data", "make_checks_anchors"} <= modules


def test_extraction_joins_continued_lines_and_spans(tmp_path):
    text = ("Prose `python -m experiments.run --config=configs/a.py\n--workdir=x` and more.\n"
            "\n```\n.venv/bin/python -m experiments.plan --devices=1 \\\n"
            "    --device_memory_gb=141   # the comment's quote\nfor s in 1 2; do python3 -m "
            "experiments.sweep --print; done\n```\n\n"
            "    ssh --command=\"cd x && .venv/bin/python -m experiments.run --verbose\"\n")
    path = tmp_path / "doc.md"
    path.write_text(text, encoding="utf-8")
    got = find_commands(path)
    assert got == [(1, "run", ["--config=configs/a.py", "--workdir=x"]),
                   (5, "plan", ["--devices=1", "--device_memory_gb=141"]),
                   (7, "sweep", ["--print"]),
                   (10, "run", ["--verbose"])]


@pytest.mark.parametrize("doc, line, module, args", COMMANDS)
def test_doc_command(doc, line, module, args):
    where = f"{doc}:{line} (experiments.{module})"
    assert not isinstance(args, Exception), f"{where}: cannot split the command: {args}"
    check_command(where, module, args)


@pytest.mark.parametrize("module, args, message", [
    ("no_such_module", [], "does not exist"),
    ("run", ["--config=configs/smollm2_cpu.py", "--no_such_flag=1"], "not a flag"),
    ("run", ["--config=configs/smollm2_cpu.py", "--config.rounds.no_such_field=1"],
     "not a field"),
    ("run", ["--config=configs/no_such_config.py"], "does not exist"),
    ("run", ["--config=configs/smollm2_cpu.py:no_such_switch"], "does not load"),
    ("plan", ["--attention=sparse"], "is not one of"),
    ("sample", ["--nopromp"], "not a flag"),
])
def test_a_broken_command_fails(module, args, message):
    with pytest.raises(AssertionError, match=message):
        check_command("doc.md:1", module, args)


def check_command(where, module, args):
    """Raises AssertionError, naming `where`, if the command is broken ((a)-(c) above)."""
    # (a) the module exists
    assert (REPO / "experiments" / f"{module}.py").is_file(), \
        f"{where}: experiments/{module}.py does not exist"
    # (b) its flags exist
    defined = dict(module_flags(module))
    for name, boolean in absl_flags().items():
        defined.setdefault(name, ("absl_bool" if boolean else "absl", None))
    config_kind = defined.get("config", ("", None))[0]
    config_arg, overrides = None, []
    for name, value, negated in parse_flags(args, defined, where):
        if name.startswith("config.") and config_kind == "DEFINE_config_file":
            overrides.append(name[len("config."):])
            continue
        assert name in defined, (f"{where}: --{name} is not a flag of experiments.{module} "
                                 f"(it defines: {', '.join(sorted(module_flags(module)))})")
        kind, choices = defined[name]
        if negated:
            assert kind in BOOL_DEFINES or kind == "absl_bool", \
                f"{where}: --no{name}, but --{name} is not boolean"
        if choices is not None and value is not None and "$" not in value:
            assert value in choices, f"{where}: --{name}={value} is not one of {choices}"
        if name == "config":
            assert value is not None, f"{where}: --config without a value"
            config_arg = value
    # (c) the config loads and the overrides name its fields
    if config_arg is None:
        assert not overrides, f"{where}: --config.* overrides without --config="
        return
    assert config_kind in ("DEFINE_config_file", "DEFINE_string"), \
        f"{where}: --config is a {config_kind} flag"
    try:
        config_module, config = load_config(config_arg)
    except AssertionError as e:
        raise AssertionError(f"{where}: {e}") from None
    except Exception as e:  # a config that fails to load is the doc's (or the config's) error
        raise AssertionError(f"{where}: --config={config_arg} does not load: "
                             f"{type(e).__name__}: {e}") from e
    for field in overrides:
        assert has_field(config, field), \
            f"{where}: --config.{field} is not a field of {config_arg}"
    if module == "sweep":
        assert hasattr(config_module, "get_sweep"), f"{where}: {config_arg} has no get_sweep()"
        for override_set in config_module.get_sweep():
            for key in override_set:
                assert key.startswith("config.") and has_field(config, key[len("config."):]), \
                    f"{where}: get_sweep() of {config_arg} overrides {key}, not a field"
