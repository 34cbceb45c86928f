"""verl's argv and environment: overrides kept in order, resume flags, user env never overridden."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_contract.launch_spec import LaunchSpec
from verl_launcher.spec import parse_launch_spec
from verl_launcher.verl import VERL_RECOMMENDED_ENV, build_argv, build_env, failure_line, override_key

ENTRY = ["python3", "-m", "verl.trainer.main_ppo"]


def make_spec(
    overrides: list[str] | None = None,
    ckpt_dir: str | None = "/ckpt/demo",
    resume: bool = False,
    env: dict[str, str] | None = None,
) -> LaunchSpec:
    doc: dict[str, Any] = {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "LaunchSpec",
        "job": {"name": "demo", "namespace": "ns"},
        "verlVersion": "0.9",
        "nnodes": 1,
        "gpusPerNode": 2,
        "head": {"host": "demo-head-0.demo-ray.ns.svc", "port": 6379},
        "entrypoint": ENTRY,
        "overrides": overrides if overrides is not None else ["algorithm.adv_estimator=grpo"],
        "env": env or {},
        "checkpoint": {"dir": ckpt_dir, "resume": resume},
    }
    return parse_launch_spec(doc)


RESUME = "trainer.resume_mode=auto"
FRESH = "trainer.resume_mode=disable"
DIR = "trainer.default_local_dir=/ckpt/demo"


@pytest.mark.parametrize(
    ("overrides", "ckpt_dir", "resume", "attempt", "tail"),
    [
        pytest.param(["a=1"], "/ckpt/demo", False, 0, ["a=1", DIR, FRESH], id="first-attempt-saves-to-dir"),
        pytest.param(["a=1"], "/ckpt/demo", False, 2, ["a=1", DIR, RESUME], id="restart-resumes"),
        pytest.param(["a=1"], "/ckpt/demo", True, 0, ["a=1", DIR, RESUME], id="resume-flag"),
        pytest.param(["a=1"], None, True, 0, ["a=1", RESUME], id="resume-without-dir"),
        pytest.param(["a=1"], None, False, 0, ["a=1", FRESH], id="no-dir-no-resume"),
        pytest.param(
            ["trainer.resume_mode=disable"],
            "/ckpt/demo",
            False,
            3,
            ["trainer.resume_mode=disable", DIR],
            id="user-resume-mode-wins",
        ),
        pytest.param(
            ["++trainer.default_local_dir=/mine"],
            "/ckpt/demo",
            False,
            1,
            ["++trainer.default_local_dir=/mine", RESUME],
            id="user-dir-wins",
        ),
    ],
)
def test_build_argv(
    overrides: list[str], ckpt_dir: str | None, resume: bool, attempt: int, tail: list[str]
) -> None:
    argv = build_argv(make_spec(overrides, ckpt_dir, resume), attempt)
    assert argv == ENTRY + tail


def test_negative_attempt_is_rejected() -> None:
    with pytest.raises(ValueError, match="attempt"):
        build_argv(make_spec(), -1)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        pytest.param("a.b=1", "a.b", id="plain"),
        pytest.param("+a.b=1", "a.b", id="plus"),
        pytest.param("++a.b=x=y", "a.b", id="plusplus-value-with-equals"),
        pytest.param("~a.b", "a.b", id="delete"),
    ],
)
def test_override_key(override: str, key: str) -> None:
    assert override_key(override) == key


def test_env_precedence() -> None:
    spec = make_spec(env={"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO", "FROM_SPEC": "1"})
    base = {"NCCL_SOCKET_IFNAME": "ib0", "TOKENIZERS_PARALLELISM": "false", "PATH": "/bin"}
    env = build_env(spec, base)
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"  # the pod's value wins over the spec
    assert env["TOKENIZERS_PARALLELISM"] == "false"  # the pod's value wins over verl's default
    assert env["NCCL_DEBUG"] == "INFO"  # the spec wins over verl's default
    assert env["FROM_SPEC"] == "1" and env["PATH"] == "/bin"
    assert env["VLLM_LOGGING_LEVEL"] == "WARN"
    assert env["RAY_ADDRESS"] == "demo-head-0.demo-ray.ns.svc:6379"
    assert base == {"NCCL_SOCKET_IFNAME": "ib0", "TOKENIZERS_PARALLELISM": "false", "PATH": "/bin"}


def test_env_without_ray_address_and_user_ray_address() -> None:
    spec = make_spec()
    assert "RAY_ADDRESS" not in build_env(spec, {}, with_ray_address=False)
    assert build_env(spec, {"RAY_ADDRESS": "10.0.0.1:1"})["RAY_ADDRESS"] == "10.0.0.1:1"


names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)


@given(
    st.dictionaries(names, st.text(max_size=5).filter(lambda s: "\x00" not in s), max_size=6),
    st.dictionaries(names, st.text(max_size=5), max_size=6),
)
def test_env_never_overrides_what_is_set(spec_env: dict[str, str], base: dict[str, str]) -> None:
    env = build_env(make_spec(env=spec_env), base)
    for name, value in base.items():
        assert env[name] == value
    for name, value in spec_env.items():
        assert env[name] == base.get(name, value)
    assert set(VERL_RECOMMENDED_ENV) <= set(env)


@given(
    st.lists(st.from_regex(r"[a-z_]{1,6}(\.[a-z_]{1,6}){0,2}=[a-z0-9]{0,4}", fullmatch=True), max_size=8),
    st.integers(min_value=0, max_value=5),
    st.booleans(),
)
def test_argv_keeps_overrides_in_order(overrides: list[str], attempt: int, resume: bool) -> None:
    argv = build_argv(make_spec(overrides, "/ckpt/demo", resume), attempt)
    assert argv[: len(ENTRY) + len(overrides)] == ENTRY + overrides
    keys = [override_key(a) for a in argv[len(ENTRY) :]]
    # The generated keys never name trainer.* (segments are at most 6 letters), so the launcher adds both.
    assert keys.count("trainer.resume_mode") == 1
    assert argv[-1] == (
        "trainer.resume_mode=auto" if attempt > 0 or resume else "trainer.resume_mode=disable"
    )
    assert keys.count("trainer.default_local_dir") == 1


#: The end of verl 0.6.1's real output for a missing train file (tests/realverl), Hydra's hint last.
VERL_MISSING_FILE_TAIL = [
    "\x1b[36m(TaskRunner pid=25258)\x1b[0m Using dataset class: RLHFDataset",
    "ray.exceptions.RayTaskError(FileNotFoundError): \x1b[36mray::TaskRunner.run()\x1b[39m (pid=25258)",
    "    raise FileNotFoundError(error_msg)",
    "FileNotFoundError: Unable to find '/data/absent.parquet'",
    "",
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
    "\x1b[36m(WorkerDict pid=3)\x1b[0m [Gloo] Rank 0 is connected to 0 peer ranks.",
]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        pytest.param(
            VERL_MISSING_FILE_TAIL, "FileNotFoundError: Unable to find '/data/absent.parquet'", id="hydra"
        ),
        pytest.param(
            ["(TaskRunner pid=7) omegaconf.errors.ConfigKeyError: Key 'x' is not in struct", "  ", ""],
            "omegaconf.errors.ConfigKeyError: Key 'x' is not in struct",
            id="ray-prefix-dotted",
        ),
        pytest.param(
            ["step:1 - a:1", "\x1b[36m(TaskRunner pid=7)\x1b[0m step:2 - a:2"],
            "step:2 - a:2",
            id="no-traceback",
        ),
        pytest.param(
            ["Error in my data: not an exception line", "done"], "done", id="prose-is-not-an-exception"
        ),
        pytest.param([], "", id="no-output"),
    ],
)
def test_failure_line_names_the_exception(lines: list[str], expected: str) -> None:
    assert failure_line(lines) == expected
