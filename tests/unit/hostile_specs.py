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


#: Keys of both verl lines the planner neither owns nor reads, with values verl accepts.
OTHER_LEAVES: dict[str, tuple[str, ...]] = {
    "trainer.total_epochs": ("1", "3"),
    "trainer.project_name": ("demo", "'a b'"),
    "trainer.save_freq": ("-1", "10"),
    "trainer.logger": ("[console]", "['console']"),
    "trainer.val_before_train": ("False",),
    "data.shuffle": ("True", "False"),
    "actor_rollout_ref.rollout.temperature": ("1.0", "0.7"),
    "actor_rollout_ref.rollout.top_p": ("1.0", "0.9"),
    "actor_rollout_ref.rollout.enforce_eager": ("True",),
    "actor_rollout_ref.rollout.val_kwargs.n": ("1", "2"),
    "actor_rollout_ref.actor.clip_ratio": ("0.2",),
    "actor_rollout_ref.actor.optim.lr": ("1e-6", "3e-6"),
    "actor_rollout_ref.actor.kl_loss_coef": ("0.001",),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ("True", "False"),
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch": ("False",),
    "critic.optim.lr": ("1e-5",),
    "algorithm.gamma": ("1.0",),
    "algorithm.lam": ("1.0", "0.95"),
}
#: Values for the planner's keys that a plan can often keep (so that many dict-valued specs are admitted).
OWNED_VALUES: dict[str, tuple[str, ...]] = {
    "trainer.nnodes": ("1", "2", "5"),
    "trainer.n_gpus_per_node": ("8", "4", "3"),
    "data.train_batch_size": ("64", "128", "7"),
    "data.max_prompt_length": ("512", "1024"),
    "data.max_response_length": ("512", "1024"),
    "actor_rollout_ref.rollout.n": ("1", "4", "5", "8", "64"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": ("1", "2", "3", "4"),
    "actor_rollout_ref.rollout.gpu_memory_utilization": ("0.5", "0.6"),
    "actor_rollout_ref.rollout.name": ("vllm",),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("16", "32"),
    "actor_rollout_ref.actor.use_dynamic_bsz": ("True", "False"),
    "actor_rollout_ref.actor.fsdp_config.param_offload": ("True", "False"),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("2", "4"),
    "actor_rollout_ref.actor.ppo_micro_batch_size": ("16",),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": ("4", "8"),
    "actor_rollout_ref.actor.use_kl_loss": ("True", "False"),
    "actor_rollout_ref.actor.entropy_coeff": ("0", "0.001"),
}


def typo(key: str, position: int, letter: str) -> str:
    """``key`` one edit away: the character at ``position`` of its last name replaced (or dropped: ``""``)."""
    parent, _, name = key.rpartition(".")
    i = position % len(name)
    return f"{parent}.{name[:i]}{letter}{name[i + 1 :]}" if len(name) > 1 or letter else f"{key}x"


def _nest(leaves: dict[str, str]) -> str:
    """The Hydra dict text that sets ``leaves`` (relative dotted keys -> value texts), nested."""
    tree: dict[str, Any] = {}
    for key, value in leaves.items():
        node = tree
        *parents, name = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[name] = value

    def render(node: dict[str, Any]) -> str:
        return "{" + ",".join(f"{k}:{render(v) if isinstance(v, dict) else v}" for k, v in node.items()) + "}"

    return render(tree)


def _parents_of(keys: Any) -> list[str]:
    return sorted({".".join(k.split(".")[:i]) for k in keys for i in range(1, k.count(".") + 1)})


#: Parents of the planner's keys (``trainer``, ``actor_rollout_ref.rollout``, ...): where dict values go.
PARENTS = tuple(_parents_of([*OWNED_VALUES, *OTHER_LEAVES]))


@st.composite
def dict_override(draw: st.DrawFn) -> str:
    """``[+|++]parent={...}`` setting a few leaves below ``parent`` (owned, read or other; nested; sometimes
    one with a typo in its name)."""
    parent = draw(st.sampled_from(PARENTS))
    pool = {k: v for k, v in {**OWNED_VALUES, **OTHER_LEAVES}.items() if k.startswith(parent + ".")}
    chosen = draw(st.lists(st.sampled_from(sorted(pool)), min_size=1, max_size=4, unique=True))
    leaves = {k[len(parent) + 1 :]: draw(st.sampled_from(pool[k])) for k in chosen}
    if draw(st.integers(0, 7)) == 0:
        bad = typo(chosen[0], draw(st.integers(0, 30)), draw(st.sampled_from(["", "x", "_"])))
        leaves = {bad[len(parent) + 1 :]: "1", **leaves}
    prefix = draw(st.sampled_from(["", "", "", "+", "++"]))
    return f"{prefix}{parent}={_nest(leaves)}"


@st.composite
def hydra_override(draw: st.DrawFn) -> str:
    """A dict value, a parent deletion, a key one typo away from a real one, or a plain leaf."""
    kind = draw(st.integers(0, 9))
    if kind <= 3:
        return draw(dict_override())
    if kind == 4:
        return "~" + draw(st.sampled_from(PARENTS + tuple(OTHER_LEAVES)))
    if kind == 5:
        key = draw(st.sampled_from(sorted({*OWNED_VALUES, *OTHER_LEAVES})))
        return f"{typo(key, draw(st.integers(0, 30)), draw(st.sampled_from(['', 'x', 'e'])))}=1"
    if kind == 6:
        return f"{draw(st.sampled_from(PARENTS))}={draw(st.sampled_from(['null', '5', '[1]', '{}']))}"
    key, values = draw(st.sampled_from(sorted({**OWNED_VALUES, **OTHER_LEAVES}.items())))
    return f"{key}={draw(st.sampled_from(values))}"


OVERRIDE = st.one_of(
    st.tuples(st.sampled_from(["", "+", "++", "~"]), st.sampled_from(KEYS), _override_value()).map(
        lambda t: f"{t[0]}{t[1]}={t[2]}"
    ),
    st.text(max_size=40),
    hydra_override(),
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


@st.composite
def dict_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A plausible spec (a catalog model, one or two 8-GPU nodes' worth) whose overrides set and delete the
    planner's keys through their parents, mixed with typos: most are admitted or denied by the planner's
    rules, not by the schema."""
    return {
        "verl": {"image": "example.com/verl:0.9.1", "version": draw(st.sampled_from(["0.6", "0.9"]))},
        "model": {"path": draw(st.sampled_from(MODELS[:2]))},
        "resources": {"gpus": draw(st.sampled_from([8, 8, 16, 4]))},
        "overrides": draw(st.lists(hydra_override(), min_size=1, max_size=4)),
    }
