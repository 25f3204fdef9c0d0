"""The item states are defined once in Python, as ItemState (tracker/model.py). The Lua library
cannot import it, so it repeats their letters and codes (its CODE and LETTER tables, and the
legend of its KEYS[1]): these tests keep the two from drifting apart."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from distscrape_celery.tracker.model import ItemState

LIVE = [state for state in ItemState if state is not ItemState.DONE]


def lua_text() -> str:
    """Every Lua file of the tracker, wherever the library keeps its tables."""
    folder = resources.files("distscrape_celery.tracker.redis").joinpath("lua")
    return "\n".join(path.read_text("utf-8") for path in sorted(folder.iterdir(), key=str)
                     if path.name.endswith(".lua"))


def table(name: str) -> str:
    found = re.findall(rf"^local {name} = \{{(.*)\}}$", lua_text(), re.M)
    assert len(found) == 1, f"the Lua library defines {name} {len(found)} times"
    return found[0]


def test_codes_are_the_states_in_their_order():
    assert [state.code for state in LIVE] == list(range(len(LIVE)))
    assert all(len(state.value) == 1 for state in ItemState)
    assert len({state.value for state in ItemState}) == len(ItemState)


def test_a_done_item_has_no_code():
    with pytest.raises(ValueError):
        ItemState.DONE.code


def test_the_lua_codes_are_item_state_codes():
    codes = {letter: int(code) for letter, code in re.findall(r"(\w) = (\d+)", table("CODE"))}
    assert codes == {state.value: state.code for state in LIVE}


def test_the_lua_letters_are_item_state_letters():
    body = table("LETTER")
    assert body.startswith("[0] = ")
    assert re.findall(r"'(\w)'", body) == [state.value for state in LIVE]


def test_the_lua_legend_names_every_state_and_points_to_model_py():
    text = lua_text()
    start = text.index("The states are the letters of")
    legend = text[start:text.index("A live item's", start)]
    assert "ItemState in tracker/model.py" in legend
    for state in LIVE:
        name = state.name.lower().replace("_", " ")
        assert re.search(rf"\b{state.value} {name}\b", legend), (state, legend)
    assert f"done item ({ItemState.DONE.value})" in legend
