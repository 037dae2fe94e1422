"""kubectl through a slice prints what it prints against kcp's virtual workspace with the slice's
selector added (``-l``), for every output format and list option. Adding a case is one line."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.conformance.conftest import SELECTOR, Pair
from tests.conformance.harness import normalise

NS = "team-red"
COMMANDS: list[tuple[str, str, list[str]]] = [
    # (id, cluster, kubectl arguments after "get")
    ("default", "*", ["widgets", "-A"]),
    ("wide", "*", ["widgets", "-A", "-o", "wide"]),
    ("name", "*", ["widgets", "-A", "-o", "name"]),
    ("json", "*", ["widgets", "-A", "-o", "json"]),
    ("yaml", "*", ["widgets", "-A", "-o", "yaml"]),
    ("jsonpath", "*", ["widgets", "-A", "-o", "jsonpath={.items[*].metadata.name}"]),
    (
        "custom-columns",
        "*",
        ["widgets", "-A", "-o", "custom-columns=NAME:.metadata.name,ENV:.metadata.labels.env"],
    ),
    ("show-labels", "*", ["widgets", "-A", "--show-labels"]),
    ("sort-by", "*", ["widgets", "-A", "--sort-by=.spec.size", "-o", "name"]),
    ("chunk-size", "*", ["widgets", "-A", "--chunk-size=2", "-o", "name"]),
    ("selector", "*", ["widgets", "-A", "-l", "region=eu"]),
    ("field-selector", "*", ["widgets", "-A", "--field-selector", "metadata.name=prod-eu"]),
    ("one-cluster", "consumer-a", ["widgets", "-n", NS]),
    ("one-cluster-yaml", "consumer-a", ["widgets", "-n", NS, "-o", "yaml"]),
    ("one-object", "consumer-a", ["widget", "prod-eu", "-n", NS, "-o", "json"]),
    ("one-object-table", "consumer-a", ["widget", "prod-eu", "-n", NS]),
]
_AGE = re.compile(r"\b\d+(\.\d+)?[smhd](\d+[smh])?\b")


def _with_selector(args: list[str]) -> list[str]:
    """The same command against kcp with the slice's selector ANDed into ``-l``."""
    out = list(args)
    if "-l" in out:
        at = out.index("-l") + 1
        out[at] = f"{SELECTOR.render()},{out[at]}"
    elif not (len(out) > 1 and not out[1].startswith("-")):  # not a GET of one named object
        out += ["-l", SELECTOR.render()]
    return out


def _normalise(stdout: str, args: list[str]) -> object:
    if "json" in args:
        return normalise(json.loads(stdout))
    if "yaml" in args:
        return normalise(yaml.safe_load(stdout))
    return _AGE.sub("<age>", stdout)


@pytest.mark.parametrize(
    ("cluster", "args"), [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS]
)
async def test_kubectl_output_equals_kcp_with_the_selector(
    pair: Pair, cluster: str, args: list[str]
) -> None:
    through = await pair.kcp.kubectl("get", *args, server=pair.slice_url(cluster), check=False)
    direct = await pair.kcp.kubectl(
        "get", *_with_selector(args), server=pair.direct_url(cluster), check=False
    )
    assert (through.returncode, through.stderr) == (direct.returncode, direct.stderr)
    assert through.stdout.strip(), through
    assert _normalise(through.stdout, args) == _normalise(direct.stdout, args)
