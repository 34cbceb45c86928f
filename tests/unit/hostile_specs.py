"""Hypothesis strategies for hostile and careless VerlJob specs: drawn from the generated CRD schema (values
inside and just outside every bound) and from verl's override grammar (the planner's keys with odd values,
unbalanced quotes and brackets, deep nesting, huge numbers). Shared by the unit-tier sample and the long run in
``bench/fuzz_admission.py``."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from verl_operator.crdgen import build_crd
from verl_operator.planner import dialect

#: The spec schema as the API server sees it.
SPEC_SCHEMA: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
    "spec"
]
#: Models of the built-in catalog (a random path needs spec.model.shape, which the schema branch draws).
MODELS = (
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-72B-Instruct",
    "my-org/model",
)
#: The planner's override keys (inputs it owns and settings it reads).
KEYS = tuple(sorted({*dialect.INPUT_KEYS, *dialect.READ_KEYS}))


def _integer(node: dict[str, Any]) -> st.SearchStrategy[int]:
    lo, hi = node.get("minimum"), node.get("maximum")
    edges = [v for v in (lo, hi, (lo or 0) - 1, (hi + 1) if hi is not None else None) if v is not None]
    small = st.integers(min_value=max(lo if lo is not None else 1, 1), max_value=64)
    outside = st.one_of(
        st.sampled_from(edges),
        st.integers(min_value=lo, max_value=hi),
        st.integers(min_value=-(10**30), max_value=10**30),
    )
    # Mostly small valid numbers (so that many specs reach the planner), sometimes an edge or a huge one.
    return st.one_of(small, small, small, outside)


def _string(node: dict[str, Any]) -> st.SearchStrategy[str]:
    if "enum" in node:
        return st.one_of(st.sampled_from(node["enum"]), st.sampled_from(node["enum"]), st.text(max_size=8))
    longest = node.get("maxLength", 64)
    samples = ["", "lots", "-5Gi", "16", "512Gi", "500m", "infinite", "a" * (longest + 1)]
    # Quantities the API server reads without error but no node has (exponents, past int64).
    samples += ["1e400", "10e399", "99999999999999999999Ei", "1e-400", "0", "1e1.5"]
    return st.one_of(st.text(max_size=24), st.sampled_from(samples))


def from_schema(node: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values for one structural schema node, mostly valid, sometimes just outside a bound."""
    kind = node.get("type")
    if kind == "integer":
        return _integer(node)
    if kind == "number":
        return st.one_of(
            st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 0.9, 1.0, 1.5])
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return _string(node)
    if kind == "array":
        items = node.get("items", {})
        most = min(node.get("maxItems", 4), 4)
        return st.lists(from_schema(items, depth + 1), max_size=most)
    if kind == "object" and "properties" in node:
        props = node["properties"]
        required = set(node.get("required", []))
        return st.fixed_dictionaries(
            {k: from_schema(v, depth + 1) for k, v in props.items() if k in required},
            optional={k: from_schema(v, depth + 1) for k, v in props.items() if k not in required},
        )
    # Free-form Kubernetes objects (env, volumes, tolerations, security contexts).
    leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
    return st.dictionaries(
        st.text(max_size=8), st.recursive(leaf, lambda c: st.lists(c, max_size=3), max_leaves=6), max_size=3
    )


def _override_value() -> st.SearchStrategy[str]:
    numbers = st.one_of(
        st.integers(min_value=-3, max_value=4096).map(str),
        st.integers(min_value=10**15, max_value=10**60).map(str),
        st.sampled_from(["0", "-1", "1e308", "nan", "inf", "-inf", "0.0", "1.5", "9" * 400]),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
    )
    words = st.sampled_from(
        ["true", "False", "null", "~", "vllm", "sync", "async", "fsdp", "megatron", "''", '"']
    )
    nested = st.integers(min_value=1, max_value=40).map(lambda d: "[" * d + "1" + "]" * d)
    broken = st.sampled_from(["[1,2", "1]", "'a", '"b', "[[1],[2]", "{a: 1}", "[" * 1000])
    return st.one_of(numbers, words, nested, broken, st.text(max_size=16))


OVERRIDE = st.one_of(
    st.tuples(st.sampled_from(["", "+", "++", "~"]), st.sampled_from(KEYS), _override_value()).map(
        lambda t: f"{t[0]}{t[1]}={t[2]}"
    ),
    st.text(max_size=40),
)


@st.composite
def hostile_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec dict: schema-drawn sections over a plausible base, plus hostile overrides."""
    spec: dict[str, Any] = {
        "verl": {"image": "example.com/verl:0.9.1", "version": draw(st.sampled_from(["0.6", "0.9"]))},
        "model": {"path": draw(st.sampled_from(MODELS))},
        "resources": {"gpus": draw(st.sampled_from([1, 2, 4, 8, 16, 24, 32, 6]))},
    }
    drawn = draw(from_schema(SPEC_SCHEMA))
    for key, value in drawn.items():
        if draw(st.integers(0, 5)) == 0:  # keep most sections plausible: one in six is drawn
            spec[key] = value
    spec["overrides"] = draw(st.one_of(st.just([]), st.lists(OVERRIDE, max_size=4)))
    return spec
