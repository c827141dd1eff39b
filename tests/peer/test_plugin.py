"""The plugin registry: one list of protocols, role names spelled once, and the mistakes it refuses
(a role of another protocol, an unknown protocol, a duplicate name) with one clear message."""

from __future__ import annotations

import pytest

from gossamer.peer.errors import ConfigError
from gossamer.peer.plugin import EventSchema, FinishRule, PluginRegistry, ProtocolPlugin
from gossamer.peer.role import Role
from gossamer.protocols.registry import PLUGINS


class Dummy(Role):
    name = "dummy"


def test_the_registry_lists_every_protocol_and_role_once() -> None:
    assert set(PLUGINS.protocols) == {"none", "diloco", "blocktrain", "tlpp", "context", "fomoe"}
    assert len(PLUGINS.role_names) == len(set(PLUGINS.role_names))
    assert "orchestrator" in PLUGINS.role_names
    for plugin in PLUGINS:
        assert set(plugin.owner_roles) <= set(plugin.roles)


def test_a_learner_in_a_tlpp_run_is_refused_naming_both_protocols() -> None:
    """Regression: ``--roles learner`` in a tlpp run used to be accepted (the DiLoCo settings reader
    never checked the run's protocol)."""
    with pytest.raises(ConfigError, match=r"role 'learner' belongs to protocol 'diloco', but run r uses protocol 'tlpp' "
                                          r"\(its roles: tlpp-orchestrator, node, helper, orchestrator\)"):
        PLUGINS.check_roles("tlpp", ["node", "learner"], run="r")


def test_unknown_roles_and_protocols_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown role 'teacher'; a 'diloco' run has roles: learner, orchestrator"):
        PLUGINS.check_roles("diloco", ["teacher"])
    with pytest.raises(ConfigError, match=r"run\.protocol 'fedsgd' is not one this version of gossamer knows"):
        PLUGINS.plugin("fedsgd")


def test_the_documented_tlpp_step_fields_are_a_step_ledgers() -> None:
    from dataclasses import fields

    from gossamer.protocols.tlpp import STEP_FIELDS
    from gossamer.protocols.tlpp.steps import StepLedger

    assert set(STEP_FIELDS) == {f.name for f in fields(StepLedger)}


def test_the_generic_orchestrator_role_belongs_to_every_protocol() -> None:
    for protocol in PLUGINS.protocols:
        assert "orchestrator" in PLUGINS.roles_of(protocol), protocol
        PLUGINS.check_roles(protocol, ["orchestrator"])  # raises ConfigError if refused


def test_duplicates_are_refused_when_the_registry_is_built() -> None:
    a = ProtocolPlugin(name="a", summary="", roles=("dummy",), load_roles=lambda: {"dummy": Dummy})
    with pytest.raises(ValueError, match="two plugins are named 'a'"):
        PluginRegistry(a, a, generic_roles={})
    with pytest.raises(ValueError, match="role 'dummy' is spelled by both 'a' and 'b'"):
        PluginRegistry(a, ProtocolPlugin(name="b", summary="", roles=("dummy",), load_roles=lambda: {"dummy": Dummy}), generic_roles={})
    with pytest.raises(ValueError, match="role 'orchestrator' is spelled by both"):
        PLUGINS.extended(ProtocolPlugin(name="c", summary="", roles=("orchestrator",), load_roles=lambda: {"orchestrator": Dummy}))


def test_a_plugin_must_declare_what_it_names() -> None:
    with pytest.raises(ValueError, match="role 'ghost' is not one of its roles"):
        ProtocolPlugin(name="a", summary="", roles=("dummy",), load_roles=lambda: {"dummy": Dummy}, owner_roles=("ghost",))
    with pytest.raises(ValueError, match="finish event 'done' is not one of its events"):
        ProtocolPlugin(name="a", summary="", finish=FinishRule("done", by="owner"),
                       events={"step": EventSchema("", ())})


def test_a_plugin_names_its_roles_and_loads_their_classes_on_first_use() -> None:
    with pytest.raises(TypeError, match="roles is a tuple of role names"):
        ProtocolPlugin(name="a", summary="", roles={"dummy": Dummy})  # type: ignore[arg-type]
    loads = []
    lazy = ProtocolPlugin(name="a", summary="", roles=("dummy",), load_roles=lambda: loads.append(1) or {"dummy": Dummy})
    assert loads == [] and lazy.role_factories() == {"dummy": Dummy} and loads == [1]
    wrong = ProtocolPlugin(name="b", summary="", roles=("dummy", "other"), load_roles=lambda: {"dummy": Dummy})
    with pytest.raises(ValueError, match="its loader gives roles"):
        wrong.role_factories()
