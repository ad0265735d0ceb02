"""The recipe's `registry:` section: defaults, load-time checks, and the command line's options over it."""

from __future__ import annotations

import pytest
from test_spec import error_of, with_changes, write_recipe

from qbench.errors import QbenchError
from qbench.recipe.registry import RegistrySpec, requested_registry
from qbench.recipe.spec import load_recipe


def test_registry_loads_with_its_defaults(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, with_changes(registry={"model": "digits-cnn"})))
    spec = recipe.registry
    assert (spec.model, spec.alias, spec.backends, spec.primary_batch_size) == ("digits-cnn", "candidate", None, None)
    assert spec.batch_size(recipe.latency.batch_sizes) == 1  # the smallest latency batch size
    given = RegistrySpec(model="m", primary_batch_size=32)
    assert given.batch_size([1, 32]) == 32
    assert load_recipe(write_recipe(tmp_path, with_changes())).registry is None


def test_changing_the_registry_section_does_not_change_the_results_fingerprint(tmp_path):
    plain = load_recipe(write_recipe(tmp_path, with_changes()))
    registered = load_recipe(write_recipe(tmp_path, with_changes(registry={"model": "m", "alias": "prod"})))
    assert plain.fingerprint() == registered.fingerprint()


@pytest.mark.parametrize(
    ("registry", "expected"),
    [
        ({"alias": "x"}, "registry.model"),
        ({"model": ""}, "registry.model"),
        ({"model": "a:b"}, "registry.model: got 'a:b', expected a registered model name without '/' or ':'"),
        ({"model": "m", "alias": "latest"}, "registry.alias: got 'latest', expected letters"),
        ({"model": "m", "alias": "v2"}, "registry.alias: got 'v2'"),
        ({"model": "m", "backends": ["tensorrt"]}, "registry.backends: got 'tensorrt'"),
        ({"model": "m", "backends": []}, "registry.backends: expected at least one backend"),
        ({"model": "m", "primary_batch_size": 8}, "registry.primary_batch_size: got 8, expected one of the latency "
                                                  "batch sizes 1, 32"),
        ({"model": "m", "name": "x"}, "registry.name"),
    ],
)  # fmt: skip
def test_bad_registry_sections_are_one_line_errors(tmp_path, registry, expected):
    message = error_of(tmp_path, with_changes(registry=registry))
    assert expected in message and message.startswith("recipe.yaml") and "\n" not in message


SECTION = RegistrySpec(model="from-recipe", alias="nightly", primary_batch_size=32)


@pytest.mark.parametrize(
    ("section", "flags", "expected"),
    [
        (None, {}, None),
        (SECTION, {}, SECTION),
        (SECTION, {"skip": True}, None),
        (SECTION, {"model": "other"}, RegistrySpec(model="other", alias="nightly", primary_batch_size=32)),
        (SECTION, {"alias": "staging"}, RegistrySpec(model="from-recipe", alias="staging", primary_batch_size=32)),
        (None, {"model": "given"}, RegistrySpec(model="given")),
    ],
)
def test_the_command_line_overrides_the_section(section, flags, expected):
    asked = {"model": None, "alias": None, "skip": False, **flags}
    assert requested_registry(section, **asked) == expected


@pytest.mark.parametrize(
    ("section", "flags", "expected"),
    [
        (None, {"alias": "staging"}, "--alias: needs --register NAME or a registry: section"),
        (SECTION, {"alias": "latest"}, "--alias: got 'latest'"),
        (SECTION, {"model": " "}, "--register: got ' ', expected a registered model name"),
        (SECTION, {"model": " spaced "}, "--register: got ' spaced ', expected a registered model name without"),
        (SECTION, {"model": "team/model"},
         "--register: got 'team/model', expected a registered model name without '/'"),
        (SECTION, {"skip": True, "model": "m"}, "--no-register: contradicts"),
    ],
)  # fmt: skip
def test_contradictory_or_bad_options_are_errors(section, flags, expected):
    asked = {"model": None, "alias": None, "skip": False, **flags}
    with pytest.raises(QbenchError, match=expected):
        requested_registry(section, **asked)
