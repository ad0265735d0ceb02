"""The documentation (README.md and the pages under docs/, read as one: `docs_text`) matches the recipe schema: every
key its YAML examples write is a field of the pydantic models (`qbench.recipe.spec.Recipe` and the sections under it),
and every field of those models is named somewhere in it, in a YAML example or in the prose (a backticked
`section.field`, or a field name no other field shares), so a field added, renamed or removed in the code cannot leave
the documentation behind; every value a field allows by name is named where the documentation writes the field, and
every `qbench` command and option is named (and none that does not exist). Its layout section ("How it is built",
on whichever page holds it) names every module under qbench/, and only modules that exist."""

from __future__ import annotations

import itertools
import re
import textwrap
import typing
from typing import Any

import pytest
import yaml
from docs_text import ROOT, documentation_files, documentation_text, located
from pydantic import BaseModel

from qbench.recipe.spec import Recipe

# `backends: [{name, accelerator}]` is how the documentation writes the pins the schema keeps in `backend_resources`
BACKEND_ENTRY = "backend_resources"


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, Union, list, dict, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models(arg)]


def _is_mapping(annotation: Any) -> bool:
    """Whether the annotation is (or may be) a dict keyed by user names (inputs, backends...), not by fields."""
    if typing.get_origin(annotation) is dict:
        return True
    return any(_is_mapping(arg) for arg in typing.get_args(annotation))


def schema_fields(model: type[BaseModel] = Recipe, prefix: str = "") -> dict[str, Any]:
    """Every field path of the schema (`data.calibration.samples`; list and dict entries add no component)."""
    paths: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        path = prefix + name
        paths[path] = field
        for sub in _models(field.annotation):
            paths.update(schema_fields(sub, path + "."))
    return paths


def _walk(model: type[BaseModel], value: Any, path: str, seen: set[str], unknown: list[str]) -> None:
    """Record the schema fields a YAML fragment writes under `model`, and the keys that are no field."""
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        field = model.model_fields.get(str(key))
        if field is None:
            unknown.append(f"{path}{key}")
            continue
        seen.add(f"{path}{key}")
        if model is Recipe and key == "backends" and isinstance(item, list):
            for entry in item:
                if isinstance(entry, dict):
                    seen.add(BACKEND_ENTRY)
                    entry = {k: v for k, v in entry.items() if k != "name"}
                    _walk(_models(Recipe.model_fields[BACKEND_ENTRY].annotation)[0], entry, BACKEND_ENTRY + ".",
                          seen, unknown)  # fmt: skip
            continue
        subs = _models(field.annotation)
        if not subs:
            continue
        if isinstance(item, list):
            entries = item
        elif isinstance(item, dict) and _is_mapping(field.annotation) and not any(set(item) <= set(sub.model_fields) for sub in subs):
            entries = list(item.values())  # keyed by user names: each value is an entry
        else:
            entries = [item]
        for entry in entries:  # a union of models (a text or an image input): the one whose fields the entry has
            fits = [sub for sub in subs if isinstance(entry, dict) and set(entry) <= set(sub.model_fields)]
            _walk((fits or subs)[0], entry, f"{path}{key}.", seen, unknown)


def readme_yaml_fragments() -> list[tuple[str, Any]]:
    """The documentation's YAML code blocks that are recipes or parts of one, each with its page and line
    (`docs/ci.md:12`): a mapping whose keys are at least half recipe sections, or a list of variant entries
    (mappings with a `precision`)."""
    fragments = []
    for page in documentation_files():
        text = page.read_text()
        for block in re.finditer(r"^( *)```yaml\n(.*?)^\1```", text, re.MULTILINE | re.DOTALL):
            where = located(page, text, block.start())
            data = yaml.safe_load(textwrap.dedent(block.group(2)))
            if isinstance(data, list) and data and all(isinstance(d, dict) and "precision" in d for d in data):
                fragments.append((where, {"variants": data}))
            elif isinstance(data, dict) and 2 * sum(str(k) in Recipe.model_fields for k in data) >= len(data):
                fragments.append((where, data))
    return fragments


def _model_at(path: str) -> type[BaseModel] | None:
    """The schema model whose fields sit under `path` ('' for the recipe itself)."""
    model: type[BaseModel] = Recipe
    for part in filter(None, path.split(".")):
        subs = _models(model.model_fields[part].annotation)
        if not subs:
            return None
        model = subs[0]
    return model


def readme_inline() -> tuple[set[str], list[tuple[str, str, Any]]]:
    """What the documentation's prose writes in backticks: the field-like names (`data.classes`, `fold: false` -> fold),
    and the inline YAML mappings (`fallback: {until: gate, max_excluded: 8}`) with the schema path they sit under,
    where their first key is a recipe section or a field name no other field has."""
    fields = schema_fields()
    leaf_paths: dict[str, list[str]] = {}
    for path in fields:
        leaf_paths.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    names, inline = set(), []
    for code in re.findall(r"`([^`\n]+)`", documentation_text()):
        found = re.match(r"\{?([A-Za-z_][\w.]*)\s*(:|$)", code.strip())
        if not found:
            continue
        names.add(found.group(1))
        if not re.match(r"[A-Za-z_]\w*: *[{\[]", code.strip()):
            continue
        try:
            data = yaml.safe_load(code)
        except yaml.YAMLError:
            continue
        first = found.group(1)
        anchors = [first] if first in Recipe.model_fields else leaf_paths.get(first, [])
        if isinstance(data, dict) and len(anchors) == 1:
            inline.append((code, anchors[0].rpartition(".")[0], data))
    return names, inline


def _documented(path: str, seen: set[str], mentions: set[str], leaves: dict[str, int]) -> bool:
    if path in seen:
        return True
    parts = path.split(".")
    suffixes = {".".join(parts[i:]) for i in range(len(parts))}
    if len(parts) > 1:  # a nested field: a dotted suffix names it, or its name alone where no other field has it
        named = {s for s in suffixes if "." in s} | ({parts[-1]} if leaves[parts[-1]] == 1 else set())
    else:
        named = {path}
    return bool(named & mentions)


def test_the_readme_has_recipe_examples():
    assert len(readme_yaml_fragments()) >= 5


@pytest.mark.parametrize("where,fragment", readme_yaml_fragments(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_key_of_a_readme_recipe_example_is_a_field(where: str, fragment: Any):
    unknown: list[str] = []
    _walk(Recipe, fragment, "", set(), unknown)
    assert not unknown, f"{where}: {unknown} are not recipe fields"


def test_the_readme_reference_recipe_passes_the_schema_as_written():
    """The recipe reference's whole recipe (the block with name, model and data) is one a user pastes: every check the
    schema makes passes on it as written (the files it names are checked when a recipe file is loaded). It once set
    `data.csv` beside its Parquet `data.path`, which the schema refuses (`csv: describes .csv/.tsv files`)."""
    whole = [(where, f) for where, f in readme_yaml_fragments() if {"name", "model", "data"} <= set(f)]
    assert whole, "the documentation has no whole recipe in its recipe reference"
    for where, fragment in whole:
        recipe = Recipe.model_validate(fragment)
        assert recipe.name == fragment["name"], where


def _differences(demo: Any, written: Any, path: str = "") -> list[str]:
    """Where `written` does not hold what `demo` sets: each of demo's keys with the same value (lists entry by entry);
    keys `demo` leaves out (options at their defaults) may be written."""
    if isinstance(demo, dict):
        if not isinstance(written, dict):
            return [f"{path or 'the recipe'}: {written!r} where the demo has a mapping"]
        return [d for key, value in demo.items()
                for d in (_differences(value, written[key], f"{path}.{key}".lstrip(".")) if key in written
                          else [f"{path}.{key}".lstrip(".") + ": missing"])]  # fmt: skip
    if isinstance(demo, list) and isinstance(written, list) and len(demo) == len(written):
        return [d for i, (a, b) in enumerate(zip(demo, written)) for d in _differences(a, b, f"{path}[{i}]")]
    return [] if demo == written else [f"{path}: {written!r}, the demo's is {demo!r}"]


def test_the_readmes_annotated_recipe_is_the_demos_recipe():
    """The README calls its annotated recipe the demo's: every value recipes/digits.yaml sets is written there alike.
    It had drifted (a faint slice of ink < 0.3 where the demo's is < 0.2, no contrast slice, no slo or cost section,
    unresolved passes failing where the demo notes them), so pasted it judged other slices than the quickstart shows."""
    demo = yaml.safe_load((ROOT / "recipes" / "digits.yaml").read_text())
    annotated = [f for where, f in readme_yaml_fragments() if where.startswith("README.md") and f.get("name") == demo["name"]]
    assert len(annotated) == 1, "the README has no whole recipe named as the demo's"
    assert not _differences(demo, annotated[0])
    assert _differences({"data": {"slices": [{"by": "a"}]}}, {"data": {"slices": [{"by": "b"}]}})  # not vacuous


@pytest.mark.parametrize("code,parent,fragment", readme_inline()[1], ids=lambda v: v if isinstance(v, str) else "")
def test_every_key_of_an_inline_readme_example_is_a_field(code: str, parent: str, fragment: Any):
    unknown: list[str] = []
    model = _model_at(parent)
    assert model is not None
    _walk(model, fragment, f"{parent}." if parent else "", set(), unknown)
    assert not unknown, f"the documentation's `{code}`: {unknown} are not recipe fields"


def test_every_recipe_field_is_named_in_the_readme():
    seen: set[str] = set()
    for _, fragment in readme_yaml_fragments():
        _walk(Recipe, fragment, "", seen, [])
    mentions, inline = readme_inline()
    for _, parent, fragment in inline:
        model = _model_at(parent)
        if model is not None:
            _walk(model, fragment, f"{parent}." if parent else "", seen, [])
    fields = schema_fields()
    leaves: dict[str, int] = {}
    for path in fields:
        leaves[path.rsplit(".", 1)[-1]] = leaves.get(path.rsplit(".", 1)[-1], 0) + 1
    missing = [path for path in fields if not _documented(path, seen, mentions, leaves)]
    assert not missing, f"recipe fields the documentation never names: {missing}"


def test_the_check_sees_an_unknown_key_and_a_missing_field():
    """The walk is not vacuous: a misspelt key is reported, and a field no fragment names is not seen."""
    unknown: list[str] = []
    seen: set[str] = set()
    _walk(Recipe, {"data": {"calibration": {"sample": 3}}, "variants": [{"name": "a", "precison": "x"}],
                   "backends": [{"name": "tensorrt", "acelerator": "H100"}]}, "", seen, unknown)  # fmt: skip
    assert unknown == ["data.calibration.sample", "variants.precison", "backend_resources.acelerator"]
    assert "data.calibration" in seen and "data.calibration.samples" not in seen


# -- the layout section ------------------------------------------------------------------------

PACKAGE = ROOT / "qbench"


def layout_entries() -> dict[str, str]:
    """The "How it is built" tree, on whichever documentation page holds that section: each entry (`recipe/spec.py`,
    `data/`) with its text, continuation lines included."""
    pattern = re.compile(r"^#+ How it is built\n.*?^```\nqbench/\n(.*?)^```", re.MULTILINE | re.DOTALL)
    sections = [found for page in documentation_files() if (found := pattern.search(page.read_text()))]
    if len(sections) != 1:
        pytest.fail(f'the documentation has {len(sections)} "How it is built" sections with a qbench/ tree, not one')
    section = sections[0]
    entries: dict[str, str] = {}
    name = ""
    for line in section.group(1).splitlines():
        entry = re.match(r"^  (\S+)\s*(.*)$", line)
        if entry:
            name = entry.group(1)
            entries[name] = entry.group(2)
        elif name:
            entries[name] += " " + line.strip()
    return entries


def test_the_layout_names_every_module_and_only_modules_that_exist():
    """A top-level module is an entry or named (`name.py`) in an entry; a subpackage's modules are named (as
    words) in its entry; every `name.py` and `package/` the tree names exists."""
    entries = layout_entries()
    text = " ".join(entries.values())
    missing = []
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name not in entries and not re.search(rf"(?<![\w/]){re.escape(path.name)}\b", text):
            missing.append(path.name)
    for package in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        if f"{package.name}/" not in entries:
            missing.append(f"{package.name}/")
            continue
        for path in sorted(package.glob("*.py")):
            if path.stem != "__init__" and not re.search(rf"\b{path.stem}\b", entries[f"{package.name}/"]):
                missing.append(f"{package.name}/{path.name}")
    assert not missing, f"modules the documentation's layout does not name: {missing}"
    named = set(entries) | set(re.findall(r"(?<![\w/.])(\w+\.py)\b", text))
    stale = sorted(n for n in named if not (PACKAGE / n).exists())
    assert not stale, f"the documentation's layout names modules that do not exist: {stale}"


# -- enumerated values and the command line ----------------------------------------------------


def _choices(annotation: Any) -> list[str]:
    """The string values a field's annotation allows by name (Literal members, through Optional, list, dict)."""
    if typing.get_origin(annotation) is typing.Literal:
        return [v for v in typing.get_args(annotation) if isinstance(v, str)]
    return [v for arg in typing.get_args(annotation) for v in _choices(arg)]


def _spellings(value: str) -> set[str]:
    """How the documentation may write a value: as is, escaped ("\\t") or as a \\u escape ("\\u00A0")."""
    forms = {value, value.encode("unicode_escape").decode()}
    if len(value) == 1 and not value.isprintable():
        forms |= {f"\\u{ord(value):04X}", f"\\u{ord(value):04x}"}
    return forms


def _field_passages(path: str, lines: list[str]) -> str:
    """The documentation lines that write the field (`leaf:` as a key, or its backticked dotted path), each with the
    YAML comment lines that continue it."""
    leaf = path.rsplit(".", 1)[-1]
    key = re.compile(rf"(?<![\w.-]){re.escape(leaf)}:|`(?:[\w.]*\.)?{re.escape(leaf)}`")
    passages = []
    for i, line in enumerate(lines):
        if key.search(line):
            passages.append(line)
            passages += [nxt for nxt in itertools.takewhile(lambda s: re.match(r"^\s+#", s), lines[i + 1:])]
    return "\n".join(passages)


def test_every_allowed_value_of_a_field_is_named_where_the_readme_writes_the_field():
    lines = documentation_text().splitlines()
    missing = []
    for path, field in schema_fields().items():
        choices = _choices(field.annotation)
        if len(choices) < 2:
            continue
        text = _field_passages(path, lines)
        missing += [f"{path}: {v!r}" for v in choices
                    if not any(re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", text)
                               for s in _spellings(v))]  # fmt: skip
    assert not missing, f"allowed values the documentation never names beside their field: {missing}"


def _commands() -> dict[str, list[tuple[str, ...]]]:
    """Every `qbench` command (`cache prune`, `export triton`) with its options, each as its long spellings
    (`--track`, `--no-track`)."""
    import typer

    from qbench.cli.app import app

    found: dict[str, list[tuple[str, ...]]] = {}

    def walk(command: Any, path: list[str]) -> None:
        if getattr(command, "commands", None):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
            return
        spellings = [tuple(o for o in (*p.opts, *getattr(p, "secondary_opts", ())) if o.startswith("--"))
                     for p in command.params]
        found[" ".join(path)] = [s for s in spellings if s and s != ("--help",)]

    walk(typer.main.get_command(app), [])
    return found


def _readme_command_lines() -> list[str]:
    """Every command line the documentation writes: a code block line or a backticked span that starts with
    `qbench`, up to a comment or a pipe."""
    text = documentation_text()
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"^\$? *(qbench [^\n]*)$", text, re.MULTILINE)
    return [re.split(r"\s(?:#|\|)", s, maxsplit=1)[0] for s in spans if re.match(r"\$? *qbench \w", s)]


def test_every_command_and_option_is_in_the_readme():
    text = documentation_text()
    missing = []
    for command, options in _commands().items():
        if f"qbench {command}" not in text:
            missing.append(f"qbench {command}")
        missing += [f"qbench {command} {'/'.join(o)}" for o in options
                    if not any(re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", text) for s in o)]  # fmt: skip
    assert not missing, f"commands and options the documentation never names: {missing}"


def test_every_option_the_readme_writes_after_a_command_exists():
    commands = _commands()
    lines = _readme_command_lines()
    assert len(lines) >= 20, lines  # the check reads the documentation's command lines, not none
    wrong = []
    for line in lines:
        words = line.lstrip("$ ").split()[1:]
        name = next((c for c in sorted(commands, key=len, reverse=True) if words[: len(c.split())] == c.split()), None)
        if name is None:
            wrong.append(line)
            continue
        wrong += [f"{line}: {o}" for o in re.findall(r"(?<!\S)(--[\w-]+)", line)
                  if o not in {*itertools.chain(*commands[name]), "--help", "--debug"}]  # fmt: skip
    assert not wrong, f"documentation command lines naming a command or option that does not exist: {wrong}"
