"""The real-verl tier's inputs, made on this machine (nothing is downloaded): a tiny random Qwen2, a byte-level
BPE tokenizer with a chat template, 16 rows of parquet in verl's format and a small reward function.

Run with the real-verl environment's interpreter (it needs torch, transformers, tokenizers and pyarrow)::

    python tests/realverl/assets.py <folder>

It writes ``<folder>/model`` (config, safetensors weights, tokenizer), ``<folder>/data/train.parquet`` and
``val.parquet``, ``<folder>/reward.py`` and last ``<folder>/.assets-ready`` holding :data:`ASSETS_VERSION`.
Everything is seeded: the same inputs give the same files.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

#: Bumped whenever what this file writes changes (the cache key of the built folder).
ASSETS_VERSION = "1"
READY = ".assets-ready"
SEED = 1234

#: Qwen2's chat format, enough for verl's ``apply_chat_template(..., add_generation_prompt=True)``.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

#: The reward verl loads through ``custom_reward_function.path``: a score that varies between random
#: responses (the share of distinct characters, plus 1 when the answer appears), so advantages and the
#: actor's gradient are not zero. verl's gsm8k rule would score every response of a random model 0.
REWARD_SOURCE = '''"""Reward of the real-verl tier (verl's custom_reward_function interface)."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    text = solution_str or ""
    distinct = len(set(text)) / max(len(text), 1)
    return distinct + (1.0 if ground_truth in text else 0.0)
'''


def _corpus(rng: random.Random) -> list[str]:
    """Text the tokenizer learns from: arithmetic questions and answers in the chat format."""
    lines = []
    for _ in range(2000):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        lines.append(
            f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n{a + b}<|im_end|>"
        )
    return lines


def build_tokenizer(folder: Path, rng: random.Random) -> object:
    """Train a byte-level BPE (vocabulary 512) and save it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def build_model(folder: Path, tokenizer: object) -> None:
    """A random Qwen2: 2 layers, hidden 64, 4 heads (2 KV heads), about 100K parameters, in float32."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    vocab = len(tokenizer)  # type: ignore[arg-type]
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=True
    )
    model.save_pretrained(folder, safe_serialization=True)


def build_data(folder: Path, rng: random.Random) -> None:
    """16 rows in verl's RL format (``prompt`` as chat messages), the same rows for validation."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for index in range(16):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append(
            {
                "data_source": "realverl/arith",
                "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": "train", "index": index},
            }
        )
    table = pa.Table.from_pylist(rows)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "train.parquet")
    pq.write_table(table, folder / "val.parquet")


def build(root: Path) -> Path:
    """Write every asset under ``root`` (the ready marker last); return ``root``."""
    rng = random.Random(SEED)
    model = root / "model"
    tokenizer = build_tokenizer(model, rng)
    build_model(model, tokenizer)
    build_data(root / "data", rng)
    (root / "reward.py").write_text(REWARD_SOURCE)
    (root / READY).write_text(json.dumps({"version": ASSETS_VERSION}) + "\n")
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: assets.py <folder>")
    print(build(Path(sys.argv[1])))
