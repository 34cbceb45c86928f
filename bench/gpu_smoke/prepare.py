"""Inputs of the GPU smoke run, all made locally (no download): a tiny randomly initialised Qwen2 model with
a byte-level BPE tokenizer, a gsm8k-like parquet dataset with a rule reward, and the launch spec.

    python prepare.py model <dir>
    python prepare.py data <dir>
    python prepare.py spec <out.json> --model <dir> --data <dir> --port <p> --ckpt <dir>
    python prepare.py check <launch.json>     # compose the spec's overrides with verl's Hydra config (CPU)

Runs in the smoke virtualenv (verl[vllm] 0.9.1: torch, transformers, tokenizers, pandas, pyarrow).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Mark"]
THINGS = ["apples", "clips", "books", "marbles", "pens", "cookies"]
#: Model vocabulary; the tokenizer is trained to fewer entries so that every id fits.
MODEL_VOCAB = 512
TOKENIZER_VOCAB = 480


def problems(count: int, seed: int) -> list[tuple[str, int]]:
    """``count`` word problems with their integer answers (deterministic for a seed)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        rows.append(
            (f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", a + b)
        )
    return rows


def make_data(out: Path) -> None:
    """Write ``train.parquet`` (64 rows) and ``val.parquet`` (8 rows) in verl's RL dataset layout."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    for split, count, seed in (("train", 64, 1), ("val", 8, 2)):
        rows: list[dict[str, Any]] = []
        for index, (question, answer) in enumerate(problems(count, seed)):
            rows.append(
                {
                    # "openai/gsm8k" selects verl's built-in rule reward (the "#### <n>" answer extractor).
                    "data_source": "openai/gsm8k",
                    "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": str(answer)},
                    "extra_info": {"split": split, "index": index},
                }
            )
        pd.DataFrame(rows).to_parquet(out / f"{split}.parquet")
    print(f"dataset written to {out}")


def make_model(out: Path) -> None:
    """Save a 2-layer Qwen2 (hidden 128, 2 heads of 64) with random weights and a locally trained tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    corpus = [f"{q} {INSTRUCTION} #### {a}" for q, a in problems(2000, 3)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        model_max_length=1024,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    if len(tokenizer) > MODEL_VOCAB:
        raise SystemExit(f"tokenizer has {len(tokenizer)} entries, more than the model's {MODEL_VOCAB}")

    config = Qwen2Config(
        vocab_size=MODEL_VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"model written to {out}: {params / 1e6:.2f}M parameters, tokenizer {len(tokenizer)} entries")


def grpo_overrides(model: Path, data: Path) -> list[str]:
    """verl 0.9 overrides for 2 GRPO steps on one GPU (server rollout with vLLM, FSDP actor)."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'val.parquet'}",
        "data.train_batch_size=8",
        "data.max_prompt_length=128",
        "data.max_response_length=32",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.optim.lr=1e-5",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.max_model_len=256",
        "actor_rollout_ref.rollout.max_num_batched_tokens=2048",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=2",
        "trainer.total_epochs=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
        "trainer.project_name=verl_gpu_smoke",
        "trainer.experiment_name=tiny_qwen2_grpo",
    ]


def make_spec(out: Path, model: Path, data: Path, port: int, ckpt: Path, python: str) -> None:
    """Write the launch spec: 1 node, 1 GPU, the head on 127.0.0.1."""
    spec = {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "LaunchSpec",
        "job": {"name": "gpu-smoke", "namespace": "local", "uid": ""},
        "verlVersion": "0.9",
        "nnodes": 1,
        "gpusPerNode": 1,
        "head": {"host": "127.0.0.1", "port": port, "dashboardPort": port + 1},
        "entrypoint": [python, "-m", "verl.trainer.main_ppo"],
        "overrides": grpo_overrides(model, data),
        "env": {"VLLM_USE_V1": "1"},
        "expect": {"gpuProduct": None, "gpuMemoryMiB": None, "requireNvlink": False, "nvlinkGroupSize": 1},
        "checkpoint": {"dir": str(ckpt), "resume": False},
        "timeouts": {"clusterReadySeconds": 300, "workerJoinSeconds": 300},
    }
    out.write_text(json.dumps(spec, indent=2))
    print(f"launch spec written to {out}")


def check_config(spec_path: Path) -> None:
    """Compose the argv the launcher builds (first attempt and a restart) with verl's own config and run
    verl's config checks; needs no GPU."""
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "launcher"))
    from verl_launcher.spec import load_launch_spec
    from verl_launcher.verl import build_argv

    spec = load_launch_spec(spec_path)
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    for attempt in (0, 1):
        overrides = build_argv(spec, attempt)[len(spec.entrypoint) :]
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            config = compose(config_name="ppo_trainer", overrides=overrides)
        validate_config(config, use_reference_policy=False, use_critic=False)
        omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
        omega_conf_to_dataclass(config.actor_rollout_ref.actor)
        print(
            f"verl {verl.__version__} accepts the launcher's argv for attempt {attempt} ({len(overrides)} overrides, "
            f"resume_mode={config.trainer.resume_mode}, default_local_dir={config.trainer.default_local_dir})"
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("model").add_argument("out", type=Path)
    sub.add_parser("data").add_argument("out", type=Path)
    spec = sub.add_parser("spec")
    spec.add_argument("out", type=Path)
    spec.add_argument("--model", type=Path, required=True)
    spec.add_argument("--data", type=Path, required=True)
    spec.add_argument("--ckpt", type=Path, required=True)
    spec.add_argument("--port", type=int, default=6390)
    spec.add_argument("--python", default=sys.executable)
    sub.add_parser("check").add_argument("spec", type=Path)
    args = parser.parse_args(argv)
    if args.what == "model":
        make_model(args.out)
    elif args.what == "data":
        make_data(args.out)
    elif args.what == "spec":
        make_spec(args.out, args.model, args.data, args.port, args.ckpt, args.python)
    else:
        check_config(args.spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
