"""Every ``ATTN_DISPATCH_*`` variable is declared once (`models.environment`), its switches accept
every spelling of on and off in any case and refuse anything else with one line naming the
variable and its accepted values, when a dispatcher, `install()` or `patched()` starts, and
docs/CONFIG.md's table is the declarations'."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from torch.nn.attention import SDPBackend, sdpa_kernel

from attn_dispatch.dispatcher import Dispatcher, install, is_installed, patched, sdpa_context
from attn_dispatch.models import environment
from attn_dispatch.models.environment import (
    IGNORE_SDPA_KERNEL,
    MEMORY_BUDGET,
    OFF_VALUES,
    ON_VALUES,
    PREFIX,
    VARIABLES,
    PathVariable,
    Switch,
    Text,
)

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("dispatcher", "models", "calibration", "kernels")
OWN_MODULE = ROOT / "models" / "environment.py"
SWITCHES = [v for v in VARIABLES if isinstance(v, Switch)]
NONSENSE = ["maybe", "2", "enabled", "tru", "0n", "nope"]


def _spellings(values: tuple[str, ...]) -> list[str]:
    return [form for value in values for form in (value, value.upper(), value.capitalize(), f" {value} ")]


@pytest.fixture(autouse=True)
def no_variable_set(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.delenv(variable.name, raising=False)


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: s.name)
def test_every_switch_reads_every_spelling_of_on_and_off(switch, monkeypatch):
    for value in _spellings(ON_VALUES):
        monkeypatch.setenv(switch.name, value)
        assert switch.read() is True, value
    for value in _spellings(OFF_VALUES):
        monkeypatch.setenv(switch.name, value)
        assert switch.read() is False, value
    for unset in ("", "  "):
        monkeypatch.setenv(switch.name, unset)
        assert switch.read() is switch.on_by_default


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: s.name)
@pytest.mark.parametrize("value", NONSENSE)
def test_every_switch_refuses_nonsense_in_one_line(switch, value, monkeypatch):
    monkeypatch.setenv(switch.name, value)
    with pytest.raises(ValueError) as raised:
        switch.read()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{switch.name}={value!r} is not an on/off value: use 1/0, true/false, on/off, yes/no")


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: s.name)
def test_a_nonsense_switch_fails_when_a_dispatcher_or_patched_starts(switch, monkeypatch):
    monkeypatch.setenv(switch.name, "maybe")
    for start in (Dispatcher, install, lambda: patched().__enter__()):
        with pytest.raises(ValueError, match=f"^{switch.name}='maybe' is not an on/off value"):
            start()
    assert not is_installed()


def test_a_bad_size_names_the_variable_and_the_fix(monkeypatch):
    monkeypatch.setenv(MEMORY_BUDGET.name, "lots")
    with pytest.raises(ValueError, match=f"^{MEMORY_BUDGET.name}='lots' is not a memory size.*unset it$"):
        environment.check()
    monkeypatch.setenv(MEMORY_BUDGET.name, " 2GiB ")
    assert MEMORY_BUDGET.read() == 2 * 2**30


def test_paths_and_text_read_as_given_and_unset_means_the_default(monkeypatch, tmp_path):
    for variable in VARIABLES:
        if isinstance(variable, (PathVariable, Text)):
            assert variable.read() is None
            monkeypatch.setenv(variable.name, f" {tmp_path} ")
            assert str(variable.read()) == str(tmp_path)


@pytest.fixture
def restrictions_follow_the_environment():
    """`respect_sdpa_kernel` not chosen, and whatever these tests change put back afterwards."""
    before = sdpa_context._chosen[0], sdpa_context.RESPECTING[0]
    sdpa_context._chosen[0], sdpa_context.RESPECTING[0] = None, True
    yield
    sdpa_context._chosen[0], sdpa_context.RESPECTING[0] = before


@pytest.mark.parametrize("value", ["1", "TRUE", "Yes", "on"])
def test_ignore_sdpa_kernel_is_read_when_a_dispatcher_starts_in_any_case(value, monkeypatch,
                                                                         restrictions_follow_the_environment):
    monkeypatch.setenv(IGNORE_SDPA_KERNEL.name, value)  # set after import: the old reader never saw it
    with sdpa_kernel([SDPBackend.MATH]):
        assert sdpa_context.backends_restricted()
        Dispatcher(kernels=["math"])
        assert not sdpa_context.backends_restricted()
        monkeypatch.setenv(IGNORE_SDPA_KERNEL.name, "off")
        with patched(Dispatcher(kernels=["math"])):
            assert sdpa_context.backends_restricted()


def test_respect_sdpa_kernel_wins_over_the_environment_until_given_none(monkeypatch,
                                                                        restrictions_follow_the_environment):
    monkeypatch.setenv(IGNORE_SDPA_KERNEL.name, "1")
    sdpa_context.respect_sdpa_kernel(True)
    Dispatcher(kernels=["math"])
    assert sdpa_context.RESPECTING[0] is True
    sdpa_context.respect_sdpa_kernel(None)
    assert sdpa_context.RESPECTING[0] is False


def test_every_variable_the_library_names_is_declared():
    declared = {variable.name for variable in VARIABLES}
    assert len(declared) == len(VARIABLES)
    named = set()
    for package in LIBRARY:
        for source in (ROOT / package).rglob("*.py"):
            named |= set(re.findall(rf"\b{PREFIX}[A-Z_]*[A-Z]\b", source.read_text()))
    assert named - declared == set()


def test_no_module_but_the_environment_holds_a_variable_name_of_its_own():
    """A reader elsewhere would need the name as a string of its own (``"ATTN_DISPATCH_X"``)."""
    holders = [str(source.relative_to(ROOT)) for package in LIBRARY for source in (ROOT / package).rglob("*.py")
               if source != OWN_MODULE and re.search(rf"[\"']{PREFIX}", source.read_text())]
    assert holders == []


def test_docs_config_holds_the_declarations_table():
    config = (ROOT / "docs" / "CONFIG.md").read_text()
    assert environment.markdown_table() in config, (
        "docs/CONFIG.md's table differs from models/environment.py: "
        "regenerate it with `python -m attn_dispatch.models.environment`")
