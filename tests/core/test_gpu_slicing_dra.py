"""GPU slicing with ``backend: dra``: the same opt-in, presets and slice-ratio rules as the
extended-resource backend, ending in one Pod-level claim from the template of the slice count.
Checked through the engine, so every patch here also passed the proof."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from function.core.config import parse_config, watches_for
from function.core.dra import TEMPLATES, DraConfig, TemplateRecord, template, template_key
from function.core.engine import Decision, Engine
from function.core.mutators.base import Action, RequestContext
from function.core.view import StaticView

NVIDIA = DraConfig()
FOUR = template(NVIDIA, 4).name
GPU = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}


def engine(**section: Any) -> Engine:
    return Engine(parse_config({"gpuSlicing": {"backend": "dra", **section}}))


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    metadata = {"annotations": {"castops.io/optimize": "true", **(annotations or {})}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def app(name: str = "app", resources: Any = None, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "cuda",
        "resources": copy.deepcopy(GPU if resources is None else resources),
        **fields,
    }


def view(*names: str, namespace: str = "ml", synced: bool = True) -> StaticView:
    records = {template_key(namespace, name): TemplateRecord(namespace, name, True) for name in names}
    return StaticView({"resourceclaimtemplates": records} if synced else {}, specs=(TEMPLATES,))


EVERY_TEMPLATE = view(*(template(NVIDIA, n).name for n in range(1, 9)))


def decide(subject: dict[str, Any], eng: Engine | None = None, cluster: Any = EVERY_TEMPLATE) -> Decision:
    decision = (eng or engine()).decide(subject, RequestContext(uid="u", namespace="ml", cluster=cluster))
    if decision.patch:
        # The patch as any RFC 6902 library applies it (not only the proof's own applier).
        assert jsonpatch.apply_patch(subject, list(decision.patch)) == decision.mutated_pod
    return decision


def slicing(decision: Decision) -> tuple[Action, str, tuple[str, ...]]:
    (part,) = [d for d in decision.decisions if d.mutator == "gpu-slicing"]
    return part.action, part.reason, part.warnings


def test_a_slice_ratio_4_pod_trades_its_gpu_for_one_claim_from_the_4_slice_template() -> None:
    decision = decide(pod({"castops.io/slice-ratio": "4"}, containers=[app()]))
    assert decision.outcome == "mutated"
    assert slicing(decision) == (
        Action.mutated,
        f"nvidia.com/gpu -> claim castslice-gpu from ResourceClaimTemplate {FOUR} "
        "(4 slices: shares 4; castops.io/slice-ratio=4) in containers/app",
        (),
    )
    stored = decision.mutated_pod
    assert stored is not None
    assert stored["spec"]["resourceClaims"] == [{"name": "castslice-gpu", "resourceClaimTemplateName": FOUR}]
    # limits and requests held only the GPU: they go with it.
    assert stored["spec"]["containers"][0]["resources"] == {"claims": [{"name": "castslice-gpu"}]}


def test_presets_and_the_default_choose_the_template_as_they_choose_the_slice_count() -> None:
    for given, slices, origin in (
        ({"castops.io/workload-type": "training"}, 4, "castops.io/workload-type=training preset"),
        ({"castops.io/workload-type": "inference"}, 2, "castops.io/workload-type=inference preset"),
        ({}, 1, "default"),
        ({"castops.io/slice-ratio": "08"}, 8, 'castops.io/slice-ratio="08", read as 8'),
    ):
        decision = decide(pod(given, containers=[app()]))
        assert decision.mutated_pod is not None
        (claim,) = decision.mutated_pod["spec"]["resourceClaims"]
        assert claim["resourceClaimTemplateName"] == template(NVIDIA, slices).name
        plural = "" if slices == 1 else "s"
        assert f"({slices} slice{plural}: shares {slices}; {origin})" in slicing(decision)[1]


def test_a_native_sidecar_init_containers_and_the_app_share_the_one_claim() -> None:
    subject = pod(
        initContainers=[app("warmup"), app("sidecar", restartPolicy="Always")],
        containers=[app(), app("cpu-only", resources={"limits": {"cpu": "1"}})],
    )
    decision = decide(subject)
    stored = decision.mutated_pod
    assert stored is not None
    assert len(stored["spec"]["resourceClaims"]) == 1
    references = [
        c["resources"].get("claims")
        for c in (*stored["spec"]["initContainers"], *stored["spec"]["containers"])
    ]
    assert references == [[{"name": "castslice-gpu"}]] * 3 + [None]
    assert "in initContainers/warmup, initContainers/sidecar, containers/app" in slicing(decision)[1]


def test_the_pods_own_claims_and_references_are_kept() -> None:
    own = {"name": "scratch", "resourceClaimTemplateName": "fast-disk"}
    subject = pod(
        resourceClaims=[own],
        containers=[app(resources={**GPU, "claims": [{"name": "scratch"}]})],
    )
    stored = decide(subject).mutated_pod
    assert stored is not None
    assert stored["spec"]["resourceClaims"] == [
        own,
        {"name": "castslice-gpu", "resourceClaimTemplateName": template(NVIDIA, 1).name},
    ]
    assert stored["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "scratch"},
        {"name": "castslice-gpu"},
    ]


def test_a_claim_name_already_taken_is_bad_input() -> None:
    taken = pod(resourceClaims=[{"name": "castslice-gpu", "resourceClaimName": "mine"}], containers=[app()])
    decision = decide(taken)
    assert decision.outcome == "denied"
    assert decision.denial == (
        "castslice: spec.resourceClaims already has a claim named castslice-gpu; "
        "set gpuSlicing.dra.claimName to another name"
    )
    warned = decide(
        taken, Engine(parse_config({"invalidAnnotations": "warn", "gpuSlicing": {"backend": "dra"}}))
    )
    assert warned.outcome == "unchanged"
    assert warned.warnings == (
        "castslice: Pod not sliced, spec.resourceClaims already has a claim named castslice-gpu",
    )


def test_a_slice_count_above_what_one_device_holds_is_denied_with_the_range() -> None:
    decision = decide(pod({"castops.io/slice-ratio": "12"}, containers=[app()]))
    assert decision.outcome == "denied"
    assert decision.denial == (
        'castslice: annotation castops.io/slice-ratio: "12" is not valid; accepted: a whole number from 1 '
        "to 8 in digits 0-9 (a leading + or leading zeros are allowed) (one gpu.nvidia.com device holds "
        "8 slices: shares 8, 1 per slice)"
    )
    warned = decide(
        pod({"castops.io/slice-ratio": "12"}, containers=[app()]),
        Engine(parse_config({"invalidAnnotations": "warn", "gpuSlicing": {"backend": "dra"}})),
    )
    assert warned.outcome == "unchanged"
    assert warned.warnings == (
        'castslice: castops.io/slice-ratio="12" ignored, Pod not sliced; '
        "use digits 0-9 for a whole number 1-8",
    )


def test_a_missing_template_is_denied_naming_it_and_the_namespace() -> None:
    decision = decide(pod({"castops.io/slice-ratio": "4"}, containers=[app()]), cluster=view())
    assert decision.outcome == "denied"
    assert decision.denial == (
        f"castslice: ResourceClaimTemplate {FOUR} (4 slices) is missing in namespace ml; the castslice "
        "controller creates it in every GPU namespace (gpuSlicing.dra.namespaceSelector)"
    )
    external = decide(
        pod({"castops.io/slice-ratio": "4"}, containers=[app()]),
        engine(dra={"templates": "external"}),
        view(),
    )
    assert external.denial is not None
    assert external.denial.endswith("apply it: castslice dra templates -n ml | kubectl apply -f -")


def test_a_template_in_another_namespace_does_not_count() -> None:
    decision = decide(
        pod({"castops.io/slice-ratio": "4"}, containers=[app()]), cluster=view(FOUR, namespace="web")
    )
    assert decision.outcome == "denied"


def test_with_missing_template_warn_the_pod_is_mutated_and_warned() -> None:
    decision = decide(
        pod({"castops.io/slice-ratio": "4"}, containers=[app()]),
        engine(dra={"missingTemplate": "warn"}),
        view(),
    )
    assert decision.outcome == "mutated"
    _, reason, warnings = slicing(decision)
    assert reason.endswith("in containers/app; template missing")
    assert warnings == (
        f"castslice: ResourceClaimTemplate {FOUR} missing; the Pod stays Pending until it exists",
    )
    assert all(len(w) <= 120 for w in warnings)


def test_without_a_synced_view_the_template_is_not_judged_and_the_reason_says_so() -> None:
    subject = pod(containers=[app()])
    offline = decide(subject, cluster=StaticView({}, available=False))
    assert slicing(offline)[1].endswith("; template presence not checked (no cluster view)")
    starting = decide(subject, cluster=view(synced=False))
    assert slicing(starting)[1].endswith("; template presence not checked (cluster view not synced)")


@pytest.mark.parametrize(
    ("subject", "reason"),
    [
        (
            pod(containers=[app(resources={"limits": {"cpu": "1"}})]),
            "opted in, but no container requests nvidia.com/gpu",
        ),
        (
            pod(containers=[app(resources={"limits": {"nvidia.com/gpu": "0"}})]),
            "opted in, but no container requests nvidia.com/gpu; "
            "containers/app asks for 0 nvidia.com/gpu, left alone",
        ),
        ({"metadata": {}, "spec": {"containers": [app()]}}, "not opted in (castops.io/optimize absent)"),
    ],
)
def test_pods_not_sliced_are_unchanged(subject: dict[str, Any], reason: str) -> None:
    decision = decide(subject)
    assert decision.outcome == "unchanged"
    assert slicing(decision)[1] == reason


def test_ephemeral_containers_are_left_out() -> None:
    subject = pod(containers=[app()], ephemeralContainers=[app("debug")])
    stored = decide(subject).mutated_pod
    assert stored is not None
    assert stored["spec"]["ephemeralContainers"] == subject["spec"]["ephemeralContainers"]


def test_the_mutated_pod_is_a_fixed_point() -> None:
    stored = decide(pod({"castops.io/slice-ratio": "4"}, containers=[app()])).mutated_pod
    again = decide(copy.deepcopy(stored))
    assert again.outcome == "unchanged"
    assert again.patch == ()


def test_shadow_mode_decides_and_sends_nothing() -> None:
    decision = decide(pod(containers=[app()]), engine(mode="shadow"))
    assert decision.outcome == "unchanged"
    assert decision.patch == ()
    assert slicing(decision)[0] is Action.mutated


def test_the_webhook_watches_templates_only_with_backend_dra() -> None:
    assert TEMPLATES in watches_for(parse_config({"gpuSlicing": {"backend": "dra"}}))
    assert TEMPLATES not in watches_for(parse_config({}))


def test_a_multi_gpu_container_gets_one_device_and_the_slice_count() -> None:
    # As with the extended-resource backend the slice count replaces the GPU count; here it is
    # the shares of one device, whatever the container asked for.
    subject = pod(
        {"castops.io/slice-ratio": "2"}, containers=[app(resources={"limits": {"nvidia.com/gpu": "2"}})]
    )
    stored = decide(subject).mutated_pod
    assert stored is not None
    assert stored["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == template(NVIDIA, 2).name
