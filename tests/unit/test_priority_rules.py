"""The priority rules of found links: the built-in ones, a function of the spec's own (loaded only
from an allowed module), and the spec section that names them."""

from __future__ import annotations

import pytest

from distscrape_celery.core.components import build_priority_rule, check_components
from distscrape_celery.core.priorities import depth_first, link_priorities
from distscrape_celery.errors import ConfigError, PluginNotAllowed
from distscrape_celery.job.spec import JobSpec, build_spec
from distscrape_celery.settings import Settings
from distscrape_celery.tracker.base import PRIORITY_MAX

RULE = "tests.plugins.priorities:shallow_path"


def spec(rule: str, **more) -> JobSpec:
    return build_spec({"seeds": ["http://a.invalid/"], "priority": {"rule": rule}, **more})


def test_breadth_first_is_no_rule_and_leaves_the_stored_spec_as_it_was():
    plain = build_spec({"seeds": ["http://a.invalid/"]})
    assert build_priority_rule(plain, Settings()) is None
    assert "priority" not in plain.to_json() and "max_duration" not in plain.to_json()
    assert spec("breadth-first").to_json() == plain.to_json()
    assert '"max_duration":60.0' in build_spec(
        {"seeds": ["http://a.invalid/"], "politeness": {"max_duration": 60}}).to_json()


def test_depth_first_ranks_deeper_links_higher():
    assert build_priority_rule(spec("depth-first"), Settings()) is depth_first
    assert link_priorities(depth_first, ["http://a.invalid/x"] * 2, 3, "p") == [3, 3]
    assert link_priorities(depth_first, ["http://a.invalid/x"], 10**6, "p") == [PRIORITY_MAX]


def test_a_rule_of_the_specs_own_loads_only_from_an_allowed_module():
    with pytest.raises(PluginNotAllowed, match="priority.rule"):
        build_priority_rule(spec(RULE), Settings())
    with pytest.raises(PluginNotAllowed, match="--priority-rule"):
        check_components(spec(RULE), Settings(), {"priority.rule": "--priority-rule"})
    rule = build_priority_rule(spec(RULE), Settings(plugin_modules=["tests.plugins"]))
    found = ["http://a.invalid/a", "http://a.invalid/a/b", "http://a.invalid/late/c"]
    assert link_priorities(rule, found, 1, "http://a.invalid/") == [7, 6, -PRIORITY_MAX]
    with pytest.raises(ConfigError, match="is not a function"):
        build_priority_rule(spec("tests.plugins.priorities:not_a_function"),
                            Settings(plugin_modules=["tests.plugins"]))


def test_a_rule_must_return_integers():
    with pytest.raises(TypeError, match="not an integer"):
        link_priorities(lambda url, depth, parent: "high", ["http://a.invalid/"], 1, "p")


@pytest.mark.parametrize("rule", ["breadth_first", "module", "a.b:c.d", ""])
def test_an_unknown_rule_is_an_error_naming_the_field(rule):
    with pytest.raises(ConfigError, match="priority.rule.*unknown rule"):
        spec(rule)
