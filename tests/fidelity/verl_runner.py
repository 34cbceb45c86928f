"""Check verl launch configurations with verl's own code; runs INSIDE a verl virtualenv.

Protocol: one JSON object on stdin, ``{"requests": [REQUEST, ...]}``, one JSON object on stdout,
``{"verlVersion": "0.9.1", "results": [RESULT, ...]}`` in the same order; with ``--serve``, one such
batch per input line and one answer per output line, until stdin closes. Everything verl prints goes to
stderr. A request is::

    {"id": "any label",
     "overrides": ["key=value", ...],           # verl Hydra overrides, as on main_ppo's command line
     "argv": ["python3", "-m", "verl.trainer.main_ppo", ...],  # instead of overrides: a whole command
     "modelShape": {"layers": 24, "hiddenSize": 896, ...},    # VerlJob spec.model.shape (camelCase)
     "verifyCompose": false,                   # also run Hydra's full compose and compare (see _compose)
     "fillModelPaths": true,                   # add the actor's / critic's model.path when missing
     "readKeys": ["trainer.nnodes", ...]}      # optional: report these keys of the composed config

and a result is ``{"id", "ok", "stage", "error_type", "error"}``; ``stage`` names the check that failed
(or the last one run when ``ok``). With ``readKeys``, a result whose composition succeeded also carries
``"values": {key: value}`` (the composed config's value as it holds it, interpolations unresolved;
``"<absent>"`` where the key does not exist), read before the later checks run.

The checks, in the order ``verl.trainer.main_ppo`` meets them:

1. ``parse``: Hydra's own command-line parser (``argv``) and override grammar (``OverridesParser``).
2. ``compose``: Hydra's compose API on verl's ``trainer/config/<config-name>.yaml`` (struct mode: an
   unknown key or a bad type fails here), with every model path replaced by a local, weight-less model
   folder of the given shape. Value-only override lists reuse one base composition (see ``_compose``).
3. ``validate_config``: ``verl.utils.config.validate_config`` with ``need_reference_policy`` and
   ``need_critic`` as main_ppo computes them for that release (this converts and validates the actor
   and critic dataclasses).
4. ``dataclass:<section>``: ``omega_conf_to_dataclass`` of the rollout and model sections, running
   their ``__post_init__`` checks; the model config loads the folder with HF ``AutoConfig`` and
   ``AutoTokenizer``. With a critic, ``dataclass:critic_model`` builds the critic's model config the same
   way from ``critic.model`` (0.9: ``HFModelConfig``; 0.6: the ``AutoConfig`` and tokenizer loads of the
   critic worker), so a critic without a loadable ``critic.model.path`` fails here.
5. ``rollout_registry``: the ``(name, mode)`` lookup of ``get_rollout_class`` in verl's
   ``_ROLLOUT_REGISTRY`` (the adapter module it then imports needs vLLM, which is not installed).
6. ``rollout_replica``: the constructor of ``RolloutReplica`` (server mode only), whose arithmetic
   checks that a replica larger than a node is a whole number of nodes.
7. ``monkey_patch``: ``verl.models.transformers.monkey_patch.apply_monkey_patch``, which the FSDP workers
   call after loading the model, on a meta-device model of the folder's config, for each Ulysses
   sequence-parallel size in use (it asserts attention and KV heads against the SP size).
8. ``megatron_*`` (actor strategy ``megatron`` only): what verl's Megatron workers run before they load
   the model, in their order (``megatron_checks`` below): the engine's asserts, megatron-core's
   process-group arithmetic, megatron-core's own ``TransformerConfig`` and ``get_num_layers_to_build``
   (megatron-core installed in the environment), and the mini-batch normalisation by Megatron's DP.

This file imports only the standard library at module level: it runs on the verl environment's Python.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

MAIN_MODULE = "verl.trainer.main_ppo"
#: ``--config-path`` values that name main_ppo's own config folder: Hydra resolves a relative path against the
#: folder of the file declaring ``@hydra.main`` (``verl/trainer/main_ppo.py``, ``config_path="config"``).
OWN_CONFIG_PATHS = ("config", "./config", "config/")
#: Override keys that name model folders; the runner points them at the generated local folder.
MODEL_PATH_KEYS = (
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.tokenizer_path",
    "actor_rollout_ref.model.hf_config_path",
    "critic.model.path",
    "critic.model.tokenizer_path",
    "critic.model.hf_config_path",
)
#: VerlJob ModelShape field -> candidate HF config attributes (the first the config class has is set).
SHAPE_FIELDS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers",),
    "hiddenSize": ("hidden_size",),
    "attentionHeads": ("num_attention_heads",),
    "kvHeads": ("num_key_value_heads",),
    "headDim": ("head_dim",),
    "intermediateSize": ("intermediate_size",),
    "vocabSize": ("vocab_size",),
    "maxPositionEmbeddings": ("max_position_embeddings",),
    "tieWordEmbeddings": ("tie_word_embeddings",),
    "numExperts": ("num_experts", "n_routed_experts", "num_local_experts"),
    "numExpertsPerTok": ("num_experts_per_tok",),
    "moeIntermediateSize": ("moe_intermediate_size",),
    "sharedExperts": ("n_shared_experts",),
    "firstKDenseReplace": ("first_k_dense_replace",),
    "kvLoraRank": ("kv_lora_rank",),
    "qLoraRank": ("q_lora_rank",),
    "qkRopeHeadDim": ("qk_rope_head_dim",),
    "qkNopeHeadDim": ("qk_nope_head_dim",),
    "vHeadDim": ("v_head_dim",),
}
DEFAULT_SHAPE: dict[str, Any] = {  # Qwen2.5-0.5B-Instruct's numbers, used when a request has no shape
    "modelType": "qwen2",
    "layers": 24,
    "hiddenSize": 896,
    "attentionHeads": 14,
    "kvHeads": 2,
    "headDim": 64,
    "intermediateSize": 4864,
    "vocabSize": 151936,
    "maxPositionEmbeddings": 32768,
    "tieWordEmbeddings": True,
}


class CheckFailed(Exception):
    """A check failed; carries the stage and the original exception."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(stage)
        self.stage = stage
        self.error = error


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2])


class ModelFolders:
    """Writes weight-less HF model folders (config.json + a tiny tokenizer), one per shape."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: dict[str, Path] = {}

    def folder(self, shape: dict[str, Any]) -> Path:
        """The folder for ``shape``, written on first use and checked by loading it back."""
        key = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]
        if key in self._done:
            return self._done[key]
        path = self.root / key
        path.mkdir(parents=True, exist_ok=True)
        self._write_config(shape, path)
        self._write_tokenizer(path)
        self._done[key] = path
        return path

    @staticmethod
    def _write_config(shape: dict[str, Any], path: Path) -> None:
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        model_type = shape.get("modelType") or ("qwen3_moe" if shape.get("numExperts") else "qwen2")
        probe = AutoConfig.for_model(model_type)  # a default instance, to learn the class's field names
        expected: dict[str, Any] = {}
        for field, candidates in SHAPE_FIELDS.items():
            value = shape.get(field)
            if value is None:
                continue
            # The first name the config class knows; else the first name, kept as an extra key of config.json
            # (HF configs load unknown keys back as attributes, e.g. head_dim on qwen2).
            attribute = next((name for name in candidates if hasattr(probe, name)), candidates[0])
            expected[attribute] = value
        # Built with the values (not set afterwards): derived fields such as layer_types follow them.
        config = AutoConfig.for_model(model_type, **expected)
        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
        config.save_pretrained(path)
        loaded = AutoConfig.from_pretrained(path)
        for attribute, value in expected.items():
            if getattr(loaded, attribute) != value:
                raise ValueError(
                    f"config.json round trip changed {attribute}: {value} -> {getattr(loaded, attribute)}"
                )

    @staticmethod
    def _write_tokenizer(path: Path) -> None:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        specials = ["<unk>", "<pad>", "<s>", "</s>"]
        words = ["the", "answer", "is", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "+", "="]
        vocab = {token: index for index, token in enumerate(specials + words)}
        backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
        )
        tokenizer.save_pretrained(path)


class Checker:
    """Runs verl's checks for one request at a time (verl imported once per process)."""

    def __init__(self, models: ModelFolders) -> None:
        import verl

        self.version: str = verl.__version__
        self.models = models
        self.config_dir = Path(verl.__file__).parent / "trainer" / "config"
        self._bases: dict[str, Any] = {}
        self._meta_models: dict[str, Any] = {}

    # -- stages ---------------------------------------------------------------------------------
    def _parse(self, request: dict[str, Any]) -> tuple[str, list[str]]:
        from hydra._internal.utils import get_args_parser
        from hydra.core.override_parser.overrides_parser import OverridesParser

        config_name = "ppo_trainer"  # main_ppo's @hydra.main(config_name=...)
        if "argv" in request:
            argv = list(request["argv"])
            if (
                len(argv) < 3
                or argv[1:3] != ["-m", MAIN_MODULE]
                or not os.path.basename(argv[0]).startswith("python")
            ):
                raise ValueError(f"argv must start with python -m {MAIN_MODULE}, got {argv[:3]}")
            # The parser hydra.main uses on sys.argv[1:] of main_ppo.
            try:
                args = get_args_parser().parse_args(argv[3:])
            except SystemExit as exc:  # argparse reports usage errors by exiting
                raise ValueError(f"hydra's argument parser rejected {argv[3:]} (exit {exc.code})") from exc
            if (args.config_path and args.config_path not in OWN_CONFIG_PATHS) or args.config_dir:
                raise ValueError("argv selects another config path; only verl's own configs are checked")
            config_name = args.config_name or config_name
            overrides = list(args.overrides)
        else:
            overrides = list(request["overrides"])
        OverridesParser.create().parse_overrides(overrides)
        return config_name, overrides

    def _localise(self, overrides: list[str], model_dir: Path, fill: bool = True) -> list[str]:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(overrides)
        out: list[str] = []
        seen: set[str] = set()
        for text, override in zip(overrides, parsed, strict=True):
            key = override.key_or_group
            if key in MODEL_PATH_KEYS:
                prefix = text[: len(text) - len(text.lstrip("+~"))]
                if override.is_delete():
                    out.append(text)
                else:
                    out.append(f"{prefix}{key}={model_dir}")
                seen.add(key)
            else:
                out.append(text)
        for key in ("actor_rollout_ref.model.path", "critic.model.path"):
            if fill and key not in seen:
                out.append(f"{key}={model_dir}")
        return out

    def _compose_full(self, config_name: str, overrides: list[str]) -> Any:
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(config_dir=str(self.config_dir), version_base=None):
            return compose(config_name=config_name, overrides=overrides)

    def _selects_configs(self, parsed: list[Any]) -> bool:
        """Whether an override changes the defaults list (a config group, a package, a hydra key)."""
        for override in parsed:
            group = self.config_dir / override.key_or_group.replace(".", "/")
            if override.is_hydra_override() or override.package is not None or group.is_dir():
                return True
        return False

    def _compose(self, config_name: str, overrides: list[str], verify: bool) -> Any:
        """Hydra's composition of ``config_name`` with ``overrides``.

        A full ``compose`` costs about 0.3 s of CPU, mostly merging the same ~30 files again. When no
        override selects a config group, the defaults list is the same for every request, so the base
        composition is done once and Hydra's own ``_apply_overrides_to_config`` applies the value
        overrides to a deep copy: the last step of ``compose`` itself, on the same struct-mode config.
        ``verify`` composes both ways and fails when they differ.
        """
        import copy

        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf

        parsed = OverridesParser.create().parse_overrides(overrides)
        if self._selects_configs(parsed):
            return self._compose_full(config_name, overrides)
        if config_name not in self._bases:
            self._bases[config_name] = self._compose_full(config_name, [])
        config = copy.deepcopy(self._bases[config_name])
        ConfigLoaderImpl._apply_overrides_to_config(parsed, config)
        if verify:
            full = self._compose_full(config_name, overrides)
            if OmegaConf.to_container(full) != OmegaConf.to_container(config):
                raise CheckFailed("compose-equivalence", RuntimeError("the shortcut composition differs"))
        return config

    def _validate_config(self, config: Any) -> tuple[bool, bool]:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        use_critic = need_critic(config)
        if _version_tuple(self.version) >= (0, 7):
            from verl.utils.device import auto_set_device

            auto_set_device(config)
            use_ref = need_reference_policy(config)
        else:
            # 0.6: TaskRunner.add_ref_policy_worker registers Role.RefPolicy on exactly this condition,
            # and need_reference_policy() tests that registration.
            from verl.trainer.ppo.utils import Role

            mapping = {}
            if config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss:
                mapping[Role.RefPolicy] = object
            use_ref = need_reference_policy(mapping)
        validate_config(config=config, use_reference_policy=use_ref, use_critic=use_critic)
        return use_ref, use_critic

    def _dataclasses(self, config: Any) -> Any:
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig, RolloutConfig

        sections: list[tuple[str, Any, type | None]] = [
            ("rollout", config.actor_rollout_ref.rollout, RolloutConfig),
            ("model", config.actor_rollout_ref.model, HFModelConfig),
        ]
        converted: dict[str, Any] = {}
        for name, section, cls in sections:
            try:
                converted[name] = omega_conf_to_dataclass(section, None if "_target_" in section else cls)
            except Exception as exc:
                raise CheckFailed(f"dataclass:{name}", exc) from exc
        return converted["rollout"]

    def _critic_model(self, config: Any, use_critic: bool) -> None:
        """The critic's model config, built as the release's critic worker builds it (when a critic is used)."""
        if not use_critic:
            return
        section = config.critic.model
        try:
            if _version_tuple(self.version) >= (0, 7):
                from verl.utils.config import omega_conf_to_dataclass
                from verl.workers.config import HFModelConfig

                omega_conf_to_dataclass(section, None if "_target_" in section else HFModelConfig)
            else:
                # 0.6 CriticWorker._build_critic_model_optimizer: copy_to_local, hf_tokenizer, AutoConfig.
                from transformers import AutoConfig
                from verl.utils import hf_tokenizer
                from verl.utils.fs import copy_to_local

                local = copy_to_local(section.path)
                hf_tokenizer(copy_to_local(section.get("tokenizer_path") or section.path))
                AutoConfig.from_pretrained(local)
        except Exception as exc:
            raise CheckFailed("dataclass:critic_model", exc) from exc

    def _rollout(self, config: Any, rollout_config: Any) -> None:
        from verl.workers.rollout import base

        rollout = config.actor_rollout_ref.rollout
        # get_rollout_class() asserts the (name, mode) pair is in this table, then imports the engine's
        # adapter module, which needs vLLM itself: only the lookup is done here.
        if (rollout.name, rollout.mode) not in base._ROLLOUT_REGISTRY:
            known = sorted(base._ROLLOUT_REGISTRY)
            raise CheckFailed(
                "rollout_registry",
                AssertionError(
                    f"Rollout {rollout.name} with mode {rollout.mode} not found (verl knows {known})"
                ),
            )
        if rollout.mode != "async":
            return  # SPMD rollout (0.6 mode=sync) builds no replica servers
        try:
            from verl.workers.rollout.replica import RolloutReplica
        except Exception as exc:
            raise CheckFailed("rollout_replica", exc) from exc

        class _ConstructOnly(RolloutReplica):  # type: ignore[misc,valid-type]
            """Runs RolloutReplica.__init__ only; nothing is launched."""

            def get_ray_class_with_init_args(self) -> Any:
                raise NotImplementedError

            async def launch_servers(self) -> None:
                raise NotImplementedError

        gpus_per_node = getattr(rollout_config, "n_gpus_per_node", None) or config.trainer.n_gpus_per_node
        try:
            _ConstructOnly(
                replica_rank=0,
                config=rollout,
                model_config=config.actor_rollout_ref.model,
                gpus_per_node=gpus_per_node,
            )
        except Exception as exc:
            raise CheckFailed("rollout_replica", exc) from exc

    def _meta_model(self, model_dir: Path) -> Any:
        """The model of ``model_dir`` built on torch's meta device: modules and shapes, no memory."""
        key = str(model_dir)
        if key not in self._meta_models:
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM

            with torch.device("meta"):
                self._meta_models[key] = AutoModelForCausalLM.from_config(
                    AutoConfig.from_pretrained(model_dir)
                )
        return self._meta_models[key]

    def _worker_patches(self, config: Any, use_ref: bool, use_critic: bool, model_dir: Path) -> None:
        """verl's ``apply_monkey_patch`` for every Ulysses SP size a worker may use (heads vs SP asserts).

        The FSDP workers call it on the loaded model; it is called here on a meta-device model of the
        same config. Every ``ulysses_sequence_parallel_size`` above 1 in the sections that get a worker
        (actor, ref when used, critic when used; top level and ``fsdp_config``) is applied.
        """
        if config.actor_rollout_ref.actor.strategy not in ("fsdp", "fsdp2"):
            return
        sections = [config.actor_rollout_ref.actor]
        sections += [config.actor_rollout_ref.ref] if use_ref else []
        sections += [config.critic] if use_critic else []
        sizes: set[int] = set()
        for section in sections:
            for node in (section, section.get("fsdp_config") or {}):
                value = node.get("ulysses_sequence_parallel_size")
                if value is not None and int(value) > 1:
                    sizes.add(int(value))
        if not sizes:
            return
        from verl.models.transformers.monkey_patch import apply_monkey_patch

        model = self._meta_model(model_dir)
        use_remove_padding = bool(config.actor_rollout_ref.model.get("use_remove_padding", False))
        for size in sorted(sizes):
            apply_monkey_patch(model=model, ulysses_sp_size=size, use_remove_padding=use_remove_padding)

    def _megatron(self, config: Any, use_critic: bool, model_dir: Path) -> None:
        """The Megatron workers' checks before they load the model (``verl_runner_megatron.py``)."""
        from verl_runner_megatron import MegatronCheckFailed, megatron_checks

        try:
            megatron_checks(self.version, config, use_critic, model_dir)
        except MegatronCheckFailed as failed:
            raise CheckFailed(failed.stage, failed.error) from failed.error

    # -- driver ---------------------------------------------------------------------------------
    def check(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run every stage on one request; return its result object."""
        stage = "parse"
        values: dict[str, Any] | None = None
        try:
            expected = request.get("version")
            if expected and not self.version.startswith(str(expected)):
                raise ValueError(f"request is for verl {expected}, this environment has verl {self.version}")
            config_name, overrides = self._parse(request)
            stage = "model"
            model_dir = self.models.folder(request.get("modelShape") or DEFAULT_SHAPE)
            stage = "compose"
            localised = self._localise(overrides, model_dir, bool(request.get("fillModelPaths", True)))
            config = self._compose(config_name, localised, bool(request.get("verifyCompose")))
            values = _read_keys(config, request.get("readKeys") or [])
            stage = "validate_config"
            use_ref, use_critic = self._validate_config(config)
            stage = "dataclass"
            rollout_config = self._dataclasses(config)
            self._critic_model(config, use_critic)
            stage = "rollout_registry"
            self._rollout(config, rollout_config)
            stage = "megatron"
            self._megatron(config, use_critic, model_dir)
            stage = "monkey_patch"
            self._worker_patches(config, use_ref, use_critic, model_dir)
        except CheckFailed as failed:
            return _with_values(_result(request, failed.stage, failed.error), values)
        except Exception as exc:
            return _with_values(_result(request, stage, exc), values)
        ok = {"id": request.get("id"), "ok": True, "stage": "all", "error_type": None, "error": None}
        return _with_values(ok, values)


ABSENT = "<absent>"


def _read_keys(config: Any, keys: list[str]) -> dict[str, Any] | None:
    """The composed values of ``keys`` as the config holds them (interpolations unresolved, nodes as plain
    containers; ``ABSENT`` for a key the config does not have)."""
    if not keys:
        return None
    from omegaconf import OmegaConf

    parents: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for key in keys:
        parent, _, leaf = key.rpartition(".")
        if parent not in parents:
            node = OmegaConf.select(config, parent) if parent else config
            parents[parent] = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_dict(node) else {}
        out[key] = parents[parent].get(leaf, ABSENT)
    return out


def _with_values(result: dict[str, Any], values: dict[str, Any] | None) -> dict[str, Any]:
    if values is not None:
        result["values"] = values
    return result


def _result(request: dict[str, Any], stage: str, error: BaseException) -> dict[str, Any]:
    message = str(error) or repr(error)
    if os.environ.get("VERL_FIDELITY_TRACEBACK"):
        message += "\n" + "".join(traceback.format_exception(error))
    return {
        "id": request.get("id"),
        "ok": False,
        "stage": stage,
        "error_type": type(error).__name__,
        "error": message[:4000],
    }


def config_keys(checker: Checker, config_name: str = "ppo_trainer") -> list[str]:
    """Every key path of verl's composed ``config_name`` config (nodes and leaves), interpolations unresolved."""
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(checker._compose_full(config_name, []), resolve=False)
    keys: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                path = f"{prefix}{key}"
                keys.append(path)
                walk(value, path + ".")

    walk(tree, "")
    return sorted(keys)


def null_keys(checker: Checker, config_name: str = "ppo_trainer") -> list[str]:
    """The leaf keys of verl's composed ``config_name`` config whose value is null (after interpolation):
    Hydra lets ``+key=value`` add to those (``ConfigLoaderImpl._apply_overrides_to_config``: ``+`` is refused
    only where ``OmegaConf.select`` finds a value that is not None)."""
    from omegaconf import OmegaConf

    config = checker._compose_full(config_name, [])
    out = []
    for key in config_keys(checker, config_name):
        try:
            node = OmegaConf.select(config, key, throw_on_missing=False)
        except Exception:  # an interpolation that needs a run (an env variable, ...)
            continue
        if node is None:
            out.append(key)
    return out


def main(argv: list[str]) -> int:
    """Check batches of requests: one JSON document on stdin, or (``--serve``) one batch per line.

    With ``--keys``, print the key paths of verl's ``ppo_trainer`` config instead (``config_keys``, and
    ``null_keys``: those whose value is null).

    In ``--serve`` mode each input line is a ``{"requests": [...]}`` batch and each answer is one line on
    stdout, so a test session keeps one process (one import of verl) per release for all its batches.
    """
    serve = "--serve" in argv
    out = sys.stdout
    workdir = Path(tempfile.mkdtemp(prefix="verl-fidelity-"))
    try:
        with contextlib.redirect_stdout(sys.stderr):  # verl prints progress; stdout carries only JSON
            checker = Checker(ModelFolders(workdir / "models"))
            if "--keys" in argv:
                name = (
                    argv[argv.index("--keys") + 1] if len(argv) > argv.index("--keys") + 1 else "ppo_trainer"
                )
                keys = config_keys(checker, name)
                nulls = null_keys(checker, name)
                out.write(
                    json.dumps({"verlVersion": checker.version, "keys": keys, "nullKeys": nulls}) + "\n"
                )
                return 0
            lines = iter(sys.stdin.readline, "")  # readline: answer each batch as soon as its line arrives
            batches = (
                (json.loads(line) for line in lines if line.strip()) if serve else [json.load(sys.stdin)]
            )
            for payload in batches:
                results = [checker.check(request) for request in payload["requests"]]
                out.write(json.dumps({"verlVersion": checker.version, "results": results}) + "\n")
                out.flush()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
