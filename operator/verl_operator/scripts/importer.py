"""A VerlJob from a verl launch script (``verl-operator import``): read, never run.

The script's ``python3 -m MODULE`` command (also ``python -m``, after ``ray job submit ... --``) is expanded by
:mod:`verl_operator.scripts.shell` with named placeholders for what the script leaves open (its environment,
its arguments, command substitutions), then turned into a VerlJob:

- ``spec.verl.entrypoint``: the module;
- ``spec.model.path``, ``spec.algorithm``, ``spec.data`` (files, batch size, lengths): from their verl keys
  (the settings registry's spelling of each) when the value is a plain one of the field's type;
- ``spec.resources.gpus`` = ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` (verl's defaults 1 and 8 when the
  script sets neither), ``gpusPerNode`` = ``trainer.n_gpus_per_node``; a two-pool trainer mode (fully_async,
  one_step_off, v1 separate_async) adds its rollout pool's GPUs and keeps both pools' keys in the overrides;
- ``spec.env``: the variables the script exports (and ``VAR=x`` before the command);
- ``spec.overrides``: every other override in the script's order (Hydra's last-wins order kept), with
  ``--config-name`` as pasted (the planner reads it);
- every placeholder named in a comment at the top of the YAML and in a warning.

The imported job plans as the script's own overrides do: what moved to a spec field is a pin of the same key.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from verl_operator.api.settings_registry import SETTINGS
from verl_operator.api.spec import SUPPORTED_VERL_VERSIONS, Algorithm, VerlJob, VerlJobSpec
from verl_operator.planner.hydra_grammar import GrammarError, parse_value
from verl_operator.planner.overrides import OverrideError, parse_override
from verl_operator.planner.pool_split import Split
from verl_operator.planner.pools import ROLLOUT_POOL_KEYS, ModeInputs, read_mode
from verl_operator.scripts import launch
from verl_operator.scripts.shell import Shell, Unsupported, placeholders

#: verl's own trainer defaults when a script sets no ``trainer.nnodes`` / ``trainer.n_gpus_per_node``
#: (``verl/trainer/config/ppo_trainer.yaml``: ``nnodes: 1``, ``n_gpus_per_node: 8``).
VERL_DEFAULT_NNODES = 1
VERL_DEFAULT_GPUS_PER_NODE = 8
#: ``--config-path`` values that name ``main_ppo``'s own config folder (Hydra resolves a relative path against
#: the folder of the module that declares ``@hydra.main``: ``verl/trainer/config``).
OWN_CONFIG_PATHS = ("config", "./config", "config/")
#: Setting -> the spec field (a path of keys under ``spec``) the importer moves its value to, when plain.
SPEC_FIELDS: dict[str, tuple[str, ...]] = {
    "model_path": ("model", "path"),
    "adv_estimator": ("algorithm",),
    "train_files": ("data", "trainFiles"),
    "val_files": ("data", "valFiles"),
    "train_batch_size": ("data", "trainBatchSize"),
    "max_prompt_length": ("data", "maxPromptLength"),
    "max_response_length": ("data", "maxResponseLength"),
}
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")
_NAME_LIMIT = 53  # the children's names add suffixes (``-head-0``, ``-ray``, ``-launch``) within 63


class ScriptImportError(ValueError):
    """The script cannot be imported (no Python module command, shell syntax not read, a bad choice)."""


@dataclasses.dataclass(frozen=True)
class Imported:
    """The result of :func:`import_script`.

    Attributes:
        job: The VerlJob document (camelCase, as ``kubectl apply`` takes it).
        text: The YAML with its header comments.
        warnings: One line per placeholder, option or key that needs the reader's attention.
    """

    job: dict[str, Any]
    text: str
    warnings: tuple[str, ...]


def job_name(source: str) -> str:
    """A VerlJob name from a script's file name (``run_qwen2-7b.sh`` -> ``run-qwen2-7b``)."""
    stem = source.rsplit("/", 1)[-1].removesuffix(".sh").lower()
    name = _DNS_LABEL.sub("-", stem.replace("_", "-").replace(".", "-")).strip("-")[:_NAME_LIMIT].strip("-")
    return name or "imported"


def _key_of(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def _setting_keys() -> dict[str, str]:
    """verl key -> setting, for the settings the importer moves to a spec field (every release's spelling)."""
    names = (*SPEC_FIELDS, "nnodes", "n_gpus_per_node")
    return {key: name for name in names for key in SETTINGS[name].keys}


def _plain(name: str, value: Any) -> Any:
    """The spec field's value of a setting's override value, or None when it is not plain (left an override)."""
    if (
        isinstance(value, str)
        and placeholders(value)
        and name not in ("model_path", "train_files", "val_files")
    ):
        return None
    if name in ("train_files", "val_files"):
        items = value if isinstance(value, list) else [value]
        return [str(v) for v in items] if all(isinstance(v, str) and v for v in items) else None
    if name == "model_path":
        return value if isinstance(value, str) and value else None
    if name == "adv_estimator":
        return value if value in {a.value for a in Algorithm} else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _put(doc: dict[str, Any], path: Sequence[str], value: Any) -> None:
    node = doc
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


@dataclasses.dataclass
class _Notes:
    """Where each placeholder was used, the warnings and the header comments."""

    uses: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    comments: list[str] = dataclasses.field(default_factory=list)

    def used(self, text: str, where: str) -> None:
        for name in placeholders(text):
            self.uses.setdefault(name, []).append(where)

    def warn(self, line: str) -> None:
        self.warnings.append(line)
        self.comments.append(line)


def _placeholder_label(name: str) -> str:
    if name == "@" or name == "*":
        return "$@ (the script's own arguments)"
    if name.isdigit():
        return f"${{{name}}} (the script's argument {name})"
    if name.startswith("$"):
        return f"{name} (a command's output, not run)"
    return f"${{{name}}}"


def import_script(
    text: str,
    source: str = "script.sh",
    *,
    environment: Mapping[str, str] | None = None,
    command: int = 1,
    image: str | None = None,
    verl_version: str = "0.9",
    name: str | None = None,
    namespace: str | None = None,
) -> Imported:
    """Read a launch script and write the VerlJob it describes.

    Args:
        text: The script.
        source: Its file name (for the job's name and the comments).
        environment: Variables the script reads from its environment (``HOME``...); others stay placeholders.
        command: Which ``python -m`` command of the script (1-based), when it has several.
        image: ``spec.verl.image``; None writes a value to replace and a warning.
        verl_version: ``spec.verl.version`` (the release line the overrides are written for).
        name: ``metadata.name``; default from the file name.
        namespace: ``metadata.namespace``; default none (kubectl's).

    Returns:
        The job, its YAML and the warnings.

    Raises:
        ScriptImportError: no ``python -m`` command, shell syntax the reader does not evaluate, ``command`` out of
            range, an unknown ``verl_version``, or a job the API models refuse.
    """
    if verl_version not in SUPPORTED_VERL_VERSIONS:
        raise ScriptImportError(
            f"--verl-version {verl_version}: use one of {', '.join(SUPPORTED_VERL_VERSIONS)}"
        )
    shell = Shell(dict(environment or {}), placeholders=True)
    try:
        found = launch.invocations(text, shell)
    except Unsupported as exc:
        raise ScriptImportError(f"{source}: shell syntax this reader does not evaluate: {exc}") from exc
    if not found:
        raise ScriptImportError(
            f"{source}: no `python3 -m MODULE` command (python -m, ray job submit ... -- python3 -m)"
        )
    if not 1 <= command <= len(found):
        lines = ", ".join(f"{i + 1}: line {inv.line} {inv.module}" for i, inv in enumerate(found))
        raise ScriptImportError(f"--command {command}: the script has {len(found)} ({lines})")
    invocation = found[command - 1]
    notes = _Notes()
    if len(found) > 1:
        others = ", ".join(f"line {inv.line} ({inv.module})" for inv in found if inv is not invocation)
        notes.warn(
            f"the script runs {len(found)} Python modules; imported line {invocation.line}, not {others}"
        )
    args = launch.hydra_args(invocation.args)
    doc = _job(
        args,
        invocation.module,
        shell,
        notes,
        image=image,
        verl_version=verl_version,
        invocation_env=invocation.env,
    )
    metadata = {"name": name or job_name(source)}
    if namespace:
        metadata["namespace"] = namespace
    doc = {"apiVersion": "verl-operator.io/v1alpha1", "kind": "VerlJob", "metadata": metadata, **doc}
    _placeholder_notes(notes, shell)
    try:
        VerlJob.model_validate(doc)
    except ValueError as exc:
        raise ScriptImportError(f"{source}: the imported VerlJob is not valid: {exc}") from exc
    header = [f"Imported from {source} line {invocation.line}: python3 -m {invocation.module} (not run)."]
    header += notes.comments
    body = yaml.safe_dump(doc, sort_keys=False, width=120, allow_unicode=True)
    text_out = "".join(f"# {line}\n" for line in header) + body
    return Imported(job=doc, text=text_out, warnings=tuple(notes.warnings))


def _job(
    args: launch.HydraArgs,
    module: str,
    shell: Shell,
    notes: _Notes,
    *,
    image: str | None,
    verl_version: str,
    invocation_env: Mapping[str, str],
) -> dict[str, Any]:
    """The ``spec`` (under ``{"spec": ...}``) of the invocation's Hydra arguments."""
    if image is None:
        image = "REPLACE-WITH-A-VERL-IMAGE"
        notes.warn(
            f"spec.verl.image: {image}: pass --image (an image with verl {verl_version} and its engines)"
        )
    spec: dict[str, Any] = {"verl": {"image": image, "version": verl_version, "entrypoint": module}}
    keys = _setting_keys()
    last: dict[str, tuple[int, Any]] = {}
    parsed: list[tuple[str, str | None]] = []  # (override, setting it pins or None)
    for raw in args.overrides:
        if raw in ("${@}", "${*}"):
            notes.warn("$@: the script passes its own arguments to verl here; add them to spec.overrides")
            continue
        setting = keys.get(_key_of(raw))
        if setting is not None and not raw.startswith("~"):
            try:
                last[setting] = (len(parsed), parse_override(raw).value)
            except OverrideError:
                setting = None
        parsed.append((raw, setting))
    moved: set[str] = set()
    for setting, path in SPEC_FIELDS.items():
        if setting in last and (value := _plain(setting, last[setting][1])) is not None:
            _put(spec, path, value)
            moved.add(setting)
            notes.used(str(value), f"spec.{'.'.join(path)}")
    nnodes, per_node = (_count(last, s, shell, notes) for s in ("nnodes", "n_gpus_per_node"))
    trainer_nnodes, trainer_gpn = nnodes or VERL_DEFAULT_NNODES, per_node or VERL_DEFAULT_GPUS_PER_NODE
    split = _two_pools([raw for raw, _ in parsed], spec["verl"], trainer_nnodes, trainer_gpn, notes)
    if split is None:
        spec["resources"] = {"gpus": trainer_nnodes * trainer_gpn, "gpusPerNode": trainer_gpn}
        moved.update(s for s, v in (("nnodes", nnodes), ("n_gpus_per_node", per_node)) if v is not None)
    else:  # the trainer pool's keys stay in the overrides, where the planner reads both pools
        spec["resources"] = {"gpus": split.trainer_gpus + split.rollout_gpus}
    if "model_path" not in moved:
        spec.setdefault("model", {})["path"] = "REPLACE-WITH-THE-MODEL"
        notes.warn("spec.model.path: the script sets no plain actor_rollout_ref.model.path")
    overrides = _config_options(args, notes)
    overrides += [_hydra_safe(raw, notes) for raw, setting in parsed if setting not in moved]
    for index, raw in enumerate(overrides):
        notes.used(raw, f"spec.overrides[{index}]")
    if overrides:
        spec["overrides"] = overrides
    for raw, unset in args.dropped:
        notes.warn(
            f"{raw} left out: {', '.join(unset)} is set but empty in the script (verl's default applies)"
        )
    env = []
    for key, value in {**shell.exported_values(), **invocation_env}.items():
        if placeholders(value):
            notes.warn(f"spec.env: {key}={value} left out (unresolved)")
        else:
            env.append({"name": key, "value": value})
    if env:
        spec["env"] = env
    return {"spec": spec}


def _hydra_safe(raw: str, notes: _Notes) -> str:
    """An override whose value holds a placeholder Hydra's grammar cannot read (a command substitution such as
    ``$(basename $MODEL_PATH)``) with its value single-quoted, as Hydra reads a quoted string; others as written.

    Example: ``trainer.experiment_name=run-$(date)`` -> ``trainer.experiment_name='run-$(date)'``.
    """
    key, sep, value = raw.partition("=")
    if not sep or not placeholders(value):
        return raw
    try:
        parse_value(value)
    except GrammarError:
        quote = "'" if "'" not in value else '"' if '"' not in value else None
        if quote is None or value.endswith("\\"):
            return raw  # no quoting keeps it whole; admission names the override
        quoted = f"{quote}{value}{quote}"
        notes.warn(f"{key}: the value is quoted for Hydra until its placeholder is filled in: {quoted}")
        return f"{key}={quoted}"
    return raw


def _count(last: Mapping[str, tuple[int, Any]], setting: str, shell: Shell, notes: _Notes) -> int | None:
    """``trainer.nnodes`` / ``trainer.n_gpus_per_node`` as a positive integer, or None (verl's default)."""
    key = SETTINGS[setting].keys[0]
    if setting not in last:
        return None
    value = last[setting][1]
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    default = VERL_DEFAULT_NNODES if setting == "nnodes" else VERL_DEFAULT_GPUS_PER_NODE
    notes.warn(
        f"spec.resources.gpus: {key}={value} is not a number; verl's default {default} taken: "
        f"set it with --set or edit spec.resources"
    )
    return None


def _two_pools(
    overrides: Sequence[str], verl: Mapping[str, str], trainer_nnodes: int, trainer_gpn: int, notes: _Notes
) -> Split | None:
    """Both pools of a two-pool trainer mode (fully_async, one_step_off, v1 separate_async) as the planner reads
    them (``pools.read_mode``: the entry point, ``trainer.v1.trainer_mode`` and the mode's rollout pool keys);
    None for a colocated mode or a rollout pool the script does not size.

    The job's GPUs are both pools' (``Split``): ``trainer.nnodes x trainer.n_gpus_per_node`` plus the rollout
    pool's nodes x GPUs per node, whose GPUs per node are the trainer's when unset (as the planner fills them).
    Example: verl's ``dapo_30b_a3b_base_math_fsdp.sh`` (fully_async): 2 x 8 trainer + 2 x 8 rollout = 32.
    """
    try:
        probe = VerlJobSpec.model_validate(
            {"verl": verl, "model": {"path": "-"}, "resources": {"gpus": 1}, "overrides": list(overrides)}
        )
    except ValueError:
        return None  # the whole job's validation names the problem
    inputs: ModeInputs = read_mode(probe)[0]
    if not inputs.two_pools:
        return None
    nodes_key, gpus_key = ROLLOUT_POOL_KEYS[inputs.mode]
    rollout_nnodes, rollout_gpn = inputs.get(nodes_key), inputs.get(gpus_key)
    if rollout_nnodes is None or rollout_nnodes < 1 or (rollout_gpn is not None and rollout_gpn < 1):
        notes.warn(
            f"{inputs.mode}: the script does not size its rollout pool ({nodes_key}, {gpus_key}): "
            "spec.resources.gpus counts the trainer pool only; add the rollout pool's GPUs to it"
        )
        return None
    return Split(trainer_nnodes, trainer_gpn, rollout_nnodes, rollout_gpn or trainer_gpn)


def _config_options(args: launch.HydraArgs, notes: _Notes) -> list[str]:
    """``--config-name`` as the planner reads it; a ``--config-path`` of the script's own and other options
    become warnings."""
    out: list[str] = []
    if args.config_path is not None and args.config_path.rstrip("/") not in {
        p.rstrip("/") for p in OWN_CONFIG_PATHS
    }:
        notes.warn(
            f"--config-path={args.config_path}: a config folder of the script's own; the VerlJob runs verl's "
            "built-in configs (put the folder's keys in spec.overrides, or build an image with it)"
        )
    if args.config_name is not None:
        out.append(f"--config-name={args.config_name}")
    for option in args.options:
        notes.warn(f"{option}: a command-line option that is not an override, left out")
    return out


def _placeholder_notes(notes: _Notes, shell: Shell) -> None:
    """One comment and warning per placeholder, naming where it is used; the defaults the script took."""
    for name, where in notes.uses.items():
        how = f"--set {name}=VALUE" if name.isidentifier() else "edit the YAML"
        notes.warn(f"unresolved {_placeholder_label(name)} in {', '.join(dict.fromkeys(where))}: {how}")
    taken = {k: v for k, v in shell.defaulted.items() if k not in ("@", "*")}
    if taken:
        notes.comments.append("Defaults the script took: " + ", ".join(f"{k}={v}" for k, v in taken.items()))
