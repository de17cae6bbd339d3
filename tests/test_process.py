"""Settings of the whole process that several holders share (``hmdspt.core.process``)."""

from __future__ import annotations

from hmdspt.core.process import (
    HUGE_PAGES,
    ProcessSetting,
    numpy_huge_page_advice,
)


def test_holding_numpys_huge_page_advice_off_gives_the_process_its_own_back(advice_on):
    seen = []
    HUGE_PAGES.hold(False)
    seen.append(numpy_huge_page_advice())
    HUGE_PAGES.hold(True)  # a second holder: the first holder's setting stays
    seen.append(numpy_huge_page_advice())
    HUGE_PAGES.release()
    seen.append(numpy_huge_page_advice())
    HUGE_PAGES.release()
    seen.append(numpy_huge_page_advice())
    assert seen == [False, False, False, True]


def test_a_process_setting_applies_its_first_holders_value_until_the_last_lets_go():
    state = {"value": "own"}

    def apply(value):
        before, state["value"] = state["value"], value
        return lambda: state.update(value=before)

    setting = ProcessSetting(apply)
    setting.hold("first")
    setting.hold("second")  # held already: the first holder's value stays
    assert state["value"] == "first"
    setting.release()
    assert state["value"] == "first"
    setting.release()
    assert state["value"] == "own"
    setting.release()  # one release too many changes nothing
    assert state["value"] == "own"
