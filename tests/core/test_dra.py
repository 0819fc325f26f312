"""The dra backend's pure parts: the configuration, the templates and their names, the records the
view keeps, and the controller's plan (function/core/dra.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from function.core.config import ConfigError, parse_config
from function.core.dra import (
    MANAGED_BY_LABEL,
    MAX_TEMPLATES,
    STALE_SINCE_ANNOTATION,
    TEMPLATES,
    DraConfig,
    NamespaceState,
    TemplateRecord,
    digest,
    gpu_namespaces,
    plan,
    slim_namespace_state,
    slim_template,
    template,
    template_spec,
    templates,
)
from function.core.quantity import times

NVIDIA = DraConfig()
HAMI = DraConfig(
    deviceClassName="hami.nvidia.com",
    capacity={
        "cores": {"perSlice": "10", "perDevice": "100"},
        "memory": {"perSlice": "2Gi", "perDevice": "16Gi"},
    },
)


def dra(**section: Any) -> DraConfig:
    return DraConfig.model_validate(section)


def load_error(section: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config({"gpuSlicing": section})
    return str(caught.value)


# -- quantities times a slice count -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("quantity", "count", "product"),
    [
        ("1", 4, "4"),
        ("2Gi", 3, "6Gi"),
        ("500m", 3, "1500m"),
        ("0.5", 3, "1.5"),
        ("0.5", 4, "2"),
        ("1e3", 2, "2e3"),
    ],
)
def test_a_slice_count_times_a_quantity_keeps_its_suffix(quantity: str, count: int, product: str) -> None:
    assert times(quantity, count) == product


# -- configuration ------------------------------------------------------------------------------------
def test_the_defaults_are_nvidias_consumable_shares_eight_per_gpu() -> None:
    assert NVIDIA.deviceClassName == "gpu.nvidia.com"
    assert NVIDIA.max_slices == 8
    assert NVIDIA.holds() == "8 slices: shares 8, 1 per slice"
    assert (NVIDIA.claimName, NVIDIA.templates, NVIDIA.missingTemplate) == (
        "castslice-gpu",
        "managed",
        "deny",
    )


def test_hamis_cores_and_memory_both_count_and_the_scarcer_one_bounds_the_slices() -> None:
    assert HAMI.max_slices == 8  # memory: 16Gi / 2Gi; cores alone would allow 10
    assert template_spec(HAMI, 3)["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"cores": "30", "memory": "6Gi"}
    }


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"capacity": {}}, "at least one device capacity"),
        (
            {"capacity": {"shares": {"perSlice": "9", "perDevice": "8"}}},
            "perSlice 9 is more than perDevice 8",
        ),
        ({"capacity": {"shares": {"perSlice": "0", "perDevice": "8"}}}, "'0' must be above 0"),
        (
            {"capacity": {"shares": {"perSlice": "one", "perDevice": "8"}}},
            "'one' is not a Kubernetes quantity",
        ),
        (
            {"capacity": {"bad name": {"perSlice": "1", "perDevice": "8"}}},
            "'bad name' is not a device capacity",
        ),
        (
            {"capacity": {"shares": {"perSlice": "1", "perDevice": "200"}}},
            f"at most {MAX_TEMPLATES}: raise perSlice",
        ),
        ({"claimName": "Castslice_GPU"}, "is not a Pod claim name"),
        ({"deviceClassName": "GPU"}, "is not a DeviceClass name"),
        ({"templatePrefix": "x" * 240}, "is not a template name prefix"),
        ({"missingTemplate": "ignore"}, "missingTemplate"),
        ({"templates": "sometimes"}, "templates"),
        ({"config": {"driver": "gpu.nvidia.com"}}, "parameters"),
        ({"unknown": 1}, "unknown key"),
    ],
)
def test_a_bad_dra_section_is_refused_at_load_naming_the_field(section: dict[str, Any], named: str) -> None:
    message = load_error({"backend": "dra", "dra": section})
    assert "gpuSlicing.dra" in message
    assert named in message


def test_mps_on_consumable_shares_is_refused_at_load() -> None:
    mps = {"driver": "gpu.nvidia.com", "parameters": {"sharing": {"strategy": "MPS"}}}
    assert "refuses sharing strategy MPS on consumable shares" in load_error(
        {"backend": "dra", "dra": {"config": mps}}
    )
    # On another capacity (not NVIDIA's consumable shares) MPS is the driver's business.
    assert dra(config=mps, capacity={"cores": {"perSlice": "10", "perDevice": "100"}}).max_slices == 10


def test_a_preset_or_default_above_what_one_device_holds_is_refused_with_backend_dra() -> None:
    message = load_error({"backend": "dra", "presets": {"training": 12}, "defaultSlices": 9})
    assert "presets.training: 12, defaultSlices: 9 are above what one device holds" in message
    assert "8 slices: shares 8, 1 per slice" in message
    # The extended-resource backend has no device bound: the same presets load.
    assert parse_config({"gpuSlicing": {"presets": {"training": 12}, "defaultSlices": 9}})


def test_the_backend_is_one_of_two() -> None:
    assert "extendedResource" in load_error({"backend": "DRA"})
    assert parse_config({}).section("gpuSlicing").backend == "extendedResource"


# -- the templates ----------------------------------------------------------------------------------
def test_a_template_asks_for_one_device_of_the_class_and_n_shares_with_the_one_driver_config() -> None:
    config = dra(
        config={"driver": "gpu.nvidia.com", "parameters": {"apiVersion": "resource.nvidia.com/v1beta1"}}
    )
    spec = template_spec(config, 4)
    assert spec["spec"]["devices"] == {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "allocationMode": "ExactCount",
                    "count": 1,
                    "capacity": {"requests": {"shares": "4"}},
                },
            }
        ],
        "config": [
            {
                "requests": ["gpu"],
                "opaque": {
                    "driver": "gpu.nvidia.com",
                    "parameters": {"apiVersion": "resource.nvidia.com/v1beta1"},
                },
            }
        ],
    }
    assert spec["metadata"]["labels"]["castops.io/slices"] == "4"


def test_the_name_is_the_prefix_the_slice_count_and_the_digest_of_the_spec() -> None:
    four = template(NVIDIA, 4)
    assert four.name == f"castslice-gpu-4-{digest(template_spec(NVIDIA, 4))}"
    assert len(four.digest) == 8
    # Pinned: webhook, controller and CLI of other versions must compute the very same name.
    assert four.name == "castslice-gpu-4-21ce539a"
    assert [t.slices for t in templates(NVIDIA)] == list(range(1, 9))


def test_any_change_of_the_spec_gives_new_names_and_anything_else_does_not() -> None:
    names = {t.name for t in templates(NVIDIA)}
    for changed in (
        dra(deviceClassName="gpu.example.com"),
        dra(capacity={"shares": {"perSlice": "2", "perDevice": "16"}}),
        dra(config={"driver": "gpu.nvidia.com", "parameters": {"sharing": {"strategy": "TimeSlicing"}}}),
    ):
        assert not names & {t.name for t in templates(changed)}
    # What the controller does with templates is not in their spec: same names.
    assert {t.name for t in templates(dra(missingTemplate="warn", staleTemplateSeconds=0))} == names


def test_the_manifest_is_labelled_as_the_controllers_own_only_when_managed() -> None:
    four = template(NVIDIA, 4)
    managed, rendered = four.manifest("ml", managed=True), four.manifest("ml", managed=False)
    assert managed["metadata"]["labels"][MANAGED_BY_LABEL] == "castslice"
    assert MANAGED_BY_LABEL not in rendered["metadata"]["labels"]
    assert managed["metadata"]["namespace"] == "ml"
    assert managed["apiVersion"] == "resource.k8s.io/v1"
    assert managed["spec"] == four.spec
    assert managed["metadata"]["annotations"] == {"castops.io/template-digest": four.digest}


def test_the_digest_is_independent_of_key_order() -> None:
    assert digest({"a": 1, "b": {"c": 2, "d": 3}}) == digest({"b": {"d": 3, "c": 2}, "a": 1})


def test_a_long_prefix_still_makes_dns_subdomain_names() -> None:
    config = dra(templatePrefix="g" * 239)
    assert len(template(config, 8).name) <= 253
    with pytest.raises(ValidationError):
        dra(templatePrefix="g" * 240)


# -- records ----------------------------------------------------------------------------------------
def template_object(namespace: str, name: str, labels: Any = None, annotations: Any = None) -> dict[str, Any]:
    metadata = {"namespace": namespace, "name": name, "labels": labels, "annotations": annotations}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": metadata}


def test_the_view_keeps_templates_by_namespace_and_name_with_ownership_and_staleness() -> None:
    obj = template_object("ml", "t", {MANAGED_BY_LABEL: "castslice"}, {STALE_SINCE_ANNOTATION: "100"})
    assert TEMPLATES.key(obj) == "ml/t"
    assert slim_template(obj) == TemplateRecord("ml", "t", True, "100")
    assert slim_template(template_object("ml", "t", {MANAGED_BY_LABEL: "Helm"})) == TemplateRecord(
        "ml", "t", False
    )
    assert slim_template(template_object("ml", "t", None, {STALE_SINCE_ANNOTATION: 5})) == TemplateRecord(
        "ml", "t", False
    )
    assert slim_template({"metadata": {"name": "t"}}) is None
    assert TEMPLATES.metadata_only
    assert TEMPLATES.path() == "/apis/resource.k8s.io/v1/resourceclaimtemplates"


def test_namespace_states_carry_labels_and_termination() -> None:
    assert slim_namespace_state(
        {"metadata": {"name": "ml", "labels": {"b": "2", "a": "1"}, "deletionTimestamp": "x"}}
    ) == NamespaceState("ml", (("a", "1"), ("b", "2")), True)
    assert slim_namespace_state({"metadata": {}}) is None


# -- the controller's plan --------------------------------------------------------------------------
NOW = 1_000_000.0


def ns(name: str, terminating: bool = False, **labels: str) -> NamespaceState:
    return NamespaceState(name, tuple(sorted(labels.items())), terminating)


def present(config: DraConfig, namespace: str, managed: bool = True) -> list[TemplateRecord]:
    return [TemplateRecord(namespace, t.name, managed) for t in templates(config)]


def test_gpu_namespaces_are_the_selected_ones_but_excluded_and_terminating() -> None:
    spaces = [ns("ml", gpu="yes"), ns("web"), ns("kube-system", gpu="yes"), ns("old", True, gpu="yes")]
    assert gpu_namespaces(NVIDIA, ["kube-system"], spaces) == ["ml", "web"]
    selective = dra(namespaceSelector={"matchLabels": {"gpu": "yes"}})
    assert gpu_namespaces(selective, ["kube-system"], spaces) == ["ml"]


def test_a_new_gpu_namespace_gets_every_template() -> None:
    result = plan(NVIDIA, [], [ns("ml"), ns("done")], present(NVIDIA, "done"), NOW)
    assert [(a.verb, a.namespace, a.name) for a in result.actions] == [
        ("create", "ml", t.name) for t in templates(NVIDIA)
    ]
    created = result.actions[3].manifest
    assert created is not None and created["metadata"]["labels"][MANAGED_BY_LABEL] == "castslice"
    assert result.recheck_after is None
    assert (
        plan(
            NVIDIA, [], [ns("ml"), ns("done")], [*present(NVIDIA, "ml"), *present(NVIDIA, "done")], NOW
        ).actions
        == ()
    )


def test_a_template_someone_else_owns_under_a_wanted_name_counts_as_present_and_is_never_touched() -> None:
    foreign = [*present(NVIDIA, "ml", managed=False), TemplateRecord("ml", "castslice-gpu-4-00000000", False)]
    assert plan(NVIDIA, [], [ns("ml")], foreign, NOW).actions == ()


def test_after_a_configuration_change_old_templates_are_marked_then_deleted_after_the_grace() -> None:
    old, new = NVIDIA, dra(deviceClassName="gpu.example.com", staleTemplateSeconds=300)
    first = plan(new, [], [ns("ml")], present(old, "ml"), NOW)
    verbs = [(a.verb, a.name) for a in first.actions]
    assert verbs[:8] == [("create", t.name) for t in templates(new)]
    assert verbs[8:] == sorted(("mark", t.name) for t in templates(old))
    assert {a.stamp for a in first.actions if a.verb == "mark"} == {"1000000"}
    assert first.recheck_after == 300

    marked = [r._replace(stale_since="1000000") for r in present(old, "ml")]
    current = [*present(new, "ml"), *marked]
    assert plan(new, [], [ns("ml")], current, NOW + 100).actions == ()
    assert plan(new, [], [ns("ml")], current, NOW + 100).recheck_after == 200
    later = plan(new, [], [ns("ml")], current, NOW + 300)
    assert sorted((a.verb, a.name) for a in later.actions) == sorted(
        ("delete", t.name) for t in templates(old)
    )
    assert later.recheck_after is None


def test_with_no_grace_old_templates_go_at_once() -> None:
    new = dra(deviceClassName="gpu.example.com", staleTemplateSeconds=0)
    result = plan(new, [], [ns("ml")], [*present(new, "ml"), *present(NVIDIA, "ml")], NOW)
    assert {a.verb for a in result.actions} == {"delete"}
    assert len(result.actions) == 8


def test_a_stale_template_named_again_is_unmarked_and_an_unreadable_mark_starts_over() -> None:
    marked = [r._replace(stale_since="1000000") for r in present(NVIDIA, "ml")]
    assert {a.verb for a in plan(NVIDIA, [], [ns("ml")], marked, NOW).actions} == {"unmark"}
    garbled = [TemplateRecord("ml", "castslice-gpu-9-old", True, "yesterday")]
    (action,) = [a for a in plan(NVIDIA, [], [], garbled, NOW).actions]
    assert (action.verb, action.stamp) == ("mark", "1000000")


def test_templates_of_a_namespace_no_longer_selected_are_its_own_stale_ones() -> None:
    selective = dra(namespaceSelector={"matchLabels": {"gpu": "yes"}}, staleTemplateSeconds=0)
    result = plan(selective, [], [ns("ml")], present(selective, "ml"), NOW)
    assert {(a.verb, a.namespace) for a in result.actions} == {("delete", "ml")}
    # A terminating namespace gets nothing new (creating there fails) and its templates go with it.
    assert plan(NVIDIA, [], [ns("ml", True)], [], NOW).actions == ()
    assert plan(selective, [], [ns("ml", True)], present(selective, "ml"), NOW).actions == ()
