"""A MutatingAdmissionPolicy for widgets, as kcp runs them: those of the APIExport's (the
provider's) workspace apply to objects written through the export's virtual workspace
(:data:`vwserver.proxy.patches.ADMISSION`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import msgspec

PROBE = "admission-probe"
"""The label that selects the widgets a policy mutates (``admission-probe=yes``)."""


def _cel_map(values: Mapping[str, str]) -> str:
    # CEL string literals accept JSON's double-quoted form for these plain strings.
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in values.items()) + "}"


def mutating_policy(
    name: str,
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    finalizers: Sequence[str] = (),
) -> str:
    """A List of a MutatingAdmissionPolicy ``probe-<name>`` and its binding that sets
    ``labels``, ``annotations`` and ``finalizers`` on widgets labelled ``admission-probe=yes``
    (create and update), for ``kubectl apply -f -``."""
    fields = [f"labels: {_cel_map(labels)}"]
    if annotations:
        fields.append(f"annotations: {_cel_map(annotations)}")
    if finalizers:
        fields.append(f"finalizers: {json.dumps(list(finalizers))}")
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": f"probe-{name}"},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["example.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["widgets"],
                    }
                ],
                "objectSelector": {"matchLabels": {PROBE: "yes"}},
            },
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {
                        "expression": "Object{metadata: Object.metadata{" + ", ".join(fields) + "}}"
                    },
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": f"probe-{name}"},
        "spec": {"policyName": f"probe-{name}"},
    }
    return msgspec.json.encode(
        {"apiVersion": "v1", "kind": "List", "items": [policy, binding]}
    ).decode()
