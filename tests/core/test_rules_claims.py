"""The apiserver's resource-claim rules as the proof applies them (validatePodResourceClaim and
validateResourceClaimNames in k8s.io/kubernetes/pkg/apis/core/validation, 1.37): a patch whose
result breaks one is withheld, so the user's Pod is never rejected because of CastSlice."""

from __future__ import annotations

from typing import Any

import pytest

from function.core.config import parse_config
from function.core.engine import Engine
from function.core.mutators.base import MutatorResult, RequestContext
from function.core.rules import (
    introduced_violations,
    is_dns_label,
    is_dns_subdomain,
    resource_claim_violations,
)


def pod(claims: Any = None, *references: Any, kind: str = "containers", **metadata: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {kind: [{"name": "c", "resources": {"claims": list(references)}}]}
    if claims is not None:
        spec["resourceClaims"] = claims
    return {"metadata": metadata, "spec": spec}


GPU = {"name": "gpu", "resourceClaimTemplateName": "castslice-gpu-4-21ce539a"}


def test_a_claim_from_a_template_referenced_by_a_container_is_valid() -> None:
    assert resource_claim_violations(pod([GPU], {"name": "gpu"})) == set()
    assert resource_claim_violations(pod([GPU], {"name": "gpu"}, kind="initContainers")) == set()
    assert resource_claim_violations(pod([GPU], {"name": "gpu", "request": "gpu"})) == set()
    assert resource_claim_violations({"spec": {"containers": [{"name": "c"}]}}) == set()


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        (pod("x"), "spec.resourceClaims must be a list"),
        (pod([1]), "spec.resourceClaims[0]: must be an object"),
        (pod([{"resourceClaimName": "a"}]), "spec.resourceClaims[0].name: required"),
        (
            pod([{"name": "GPU", "resourceClaimName": "a"}]),
            "spec.resourceClaims[0].name: 'GPU' is not a DNS label",
        ),
        (
            pod([{"name": "g" * 64, "resourceClaimName": "a"}]),
            f"spec.resourceClaims[0].name: '{'g' * 64}' is not a DNS label",
        ),
        (pod([GPU, GPU]), "spec.resourceClaims[1].name: 'gpu' is a duplicate"),
        (
            pod([{"name": "a"}]),
            "spec.resourceClaims[0]: needs exactly one of resourceClaimName and resourceClaimTemplateName",
        ),
        (
            pod([{"name": "a", "resourceClaimName": "x", "resourceClaimTemplateName": "y"}]),
            "spec.resourceClaims[0]: needs exactly one of resourceClaimName and resourceClaimTemplateName",
        ),
        (
            pod([{"name": "a", "resourceClaimTemplateName": "Bad_Name"}]),
            "spec.resourceClaims[0].resourceClaimTemplateName: 'Bad_Name' is not a DNS subdomain",
        ),
        (
            pod([GPU], {"name": "other"}),
            "spec.containers[0] (c): resources.claims[0]: 'other' must be one of the names in "
            "spec.resourceClaims",
        ),
        (pod([GPU], {"request": "x"}), "spec.containers[0] (c): resources.claims[0].name: required"),
        (pod([GPU], "gpu"), "spec.containers[0] (c): resources.claims[0] must be an object"),
        (
            pod([GPU], {"name": "gpu"}, {"name": "gpu"}),
            "spec.containers[0] (c): resources.claims[1]: 'gpu' is a duplicate",
        ),
        (
            pod([GPU], {"name": "gpu", "request": "a"}, {"name": "gpu"}),
            "spec.containers[0] (c): resources.claims[1]: 'gpu' is a duplicate",
        ),
        (
            pod([GPU], {"name": "gpu"}, {"name": "gpu", "request": "a"}),
            "spec.containers[0] (c): resources.claims[1]: 'gpu/a' is a duplicate",
        ),
        (
            pod([GPU], {"name": "gpu", "request": "A"}),
            "spec.containers[0] (c): resources.claims[0].request: 'A' is not a DNS label",
        ),
        (
            pod([GPU], {"name": "gpu"}, kind="ephemeralContainers"),
            "spec.ephemeralContainers[0] (c): resources.claims may not be set in an ephemeral container",
        ),
        (
            pod([GPU], annotations={"kubernetes.io/config.mirror": "x"}),
            "spec.resourceClaims: static pods do not support resource claims",
        ),
    ],
)
def test_each_rule_the_apiserver_enforces(subject: dict[str, Any], problem: str) -> None:
    assert problem in resource_claim_violations(subject)


def test_requests_of_one_claim_may_be_referenced_apart() -> None:
    assert (
        resource_claim_violations(
            pod([GPU], {"name": "gpu", "request": "a"}, {"name": "gpu", "request": "b"})
        )
        == set()
    )


def test_dns_names_at_their_edges() -> None:
    assert is_dns_label("a" * 63) and not is_dns_label("a" * 64)
    assert not is_dns_label("a.b") and not is_dns_label("-a") and not is_dns_label("a-")
    assert is_dns_subdomain("a.b-c.d") and not is_dns_subdomain("a..b") and not is_dns_subdomain("a" * 254)
    assert not is_dns_label(None) and not is_dns_subdomain(7)


def test_only_violations_the_result_introduces_count() -> None:
    broken = pod([GPU, GPU])
    assert introduced_violations(broken, broken) == set()
    added = pod([GPU, GPU, {"name": "x"}])
    assert introduced_violations(broken, added) == {
        "spec.resourceClaims[2]: needs exactly one of resourceClaimName and resourceClaimTemplateName"
    }


class AddsAReferenceToNoClaim:
    """A mutator with a bug: it references a claim the Pod does not have."""

    name = "gpu-slicing"

    def mutate(self, subject: dict[str, Any], ctx: RequestContext) -> MutatorResult:
        container = subject["spec"]["containers"][0]
        if "resources" in container:
            return MutatorResult.unchanged("done")
        container["resources"] = {"claims": [{"name": "castslice-gpu"}]}
        return MutatorResult.mutated("referenced a claim")


def test_a_patch_the_apiserver_would_reject_for_its_claims_is_withheld() -> None:
    engine = Engine(parse_config({}), mutators=[AddsAReferenceToNoClaim()], shadow=[])
    decision = engine.decide({"spec": {"containers": [{"name": "c"}]}}, RequestContext(namespace="ml"))
    assert decision.outcome == "error"
    assert decision.allowed
    assert decision.patch == ()
    assert "'castslice-gpu' must be one of the names in spec.resourceClaims" in decision.reason
