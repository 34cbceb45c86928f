"""Regenerate ``tests/fidelity/data/memory-evidence.csv``: public fit / out-of-memory evidence for verl runs.

Two sources in verl's repository, read at one ref with ``git show`` (nothing is run):

- ``docs/perf/device_tuning.rst`` lists, per model, the smallest resources a configuration ran on, each with
  its script under ``examples/tuning/``: every FSDP + vLLM script there, at its own values, is a known fit;
- some of those scripts record the binary search that found their batch size in a comment
  (``nproc_per_gpu=58 # 32<check> → 64<cross> → 48<check> ...``): each tried value is a fit (check mark)
  or did not fit (cross). The row's
  overrides are the script read with that value (``verl_operator.scripts.shell``), so every batch setting derived from it moves.

``--table-rows`` instead prints (CSV, no header, for appending) the rows of ``docs/perf/dpsk.md``'s Qwen3-235B-A22B
table read with the script revision the table was published with (``TABLE_COMMIT``): that revision recomputes
every layer and pins ``num_layers_in_last_pipeline_stage=${LAST_LAYER}``, which the table's column sets; a later
revision (f6f9100) dropped both and left the table as it was.

Usage::

    python tests/fidelity/corpus/memory_evidence.py --git-dir /path/to/verl.git --ref HEAD \\
        --out tests/fidelity/data/memory-evidence.csv
    python tests/fidelity/corpus/memory_evidence.py --git-dir /path/to/verl.git --table-rows \\
        >> tests/fidelity/data/memory-evidence.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from extract import _git, _last, _split_args, invocations

#: GPU named in a tuning script's file name -> (nvidia.com/gpu.product, memory MiB as nvidia-smi reports it).
GPUS = {
    "h100": ("NVIDIA-H100-80GB-HBM3", 81559),
    "h800": ("NVIDIA-H800", 81559),
    "h20": ("NVIDIA-H20", 97871),
}
#: The marks of the search comments: U+221A fits, U+00D7 did not.
FITS, MISSED = "\u221a", "\u00d7"
_SEARCH = re.compile(rf"^(\s*)([A-Za-z_][A-Za-z0-9_]*)=(\d+)\s*#\s*(.*[{FITS}{MISSED}].*)$", re.MULTILINE)
_STEP = re.compile(rf"(\d+)\s*([{FITS}{MISSED}])")
_FILE = re.compile(r"_(\d+)_([a-z0-9]+)_fsdp_vllm\.sh$")
COLUMNS = [
    "id", "source", "commit", "path", "evidence", "setting", "value", "verdict",
    "gpu_product", "gpu_memory_mib", "nnodes", "gpus_per_node", "model", "dataset", "overrides",
]  # fmt: skip
#: Datasets recognised in ``data.train_files`` (the row's ``dataset``; the test knows their typical lengths).
DATASETS = ("gsm8k", "math", "geo3k")


def _dataset(train_files: str | None) -> str:
    """The first known dataset name in the training files' path, else empty."""
    lowered = (train_files or "").lower()
    return next((name for name in DATASETS if name in lowered), "")


def _rows_for(
    text: str, path: str, commit: str, evidence: str, verdict: str, setting: str, value: str
) -> list[dict[str, str]]:
    match = _FILE.search(path)
    if match is None or match.group(2) not in GPUS:
        return []
    product, memory = GPUS[match.group(2)]
    out = []
    for index, found in enumerate(invocations(text)):
        args = _split_args(found.args)
        overrides = args["overrides"]
        nnodes, gpn = _last(overrides, "trainer.nnodes"), _last(overrides, "trainer.n_gpus_per_node")
        out.append(
            {
                "id": f"{path}#{index}@{setting or 'as-written'}={value}",
                "source": "volcengine/verl",
                "commit": commit,
                "path": path,
                "evidence": evidence,
                "setting": setting,
                "value": value,
                "verdict": verdict,
                "gpu_product": product,
                "gpu_memory_mib": str(memory),
                "nnodes": nnodes or "1",
                "gpus_per_node": gpn or "8",
                "model": _last(overrides, "actor_rollout_ref.model.path") or "",
                "dataset": _dataset(_last(overrides, "data.train_files")),
                "overrides": json.dumps(overrides),
            }
        )
    return out


def evidence(git_dir: str, ref: str) -> list[dict[str, str]]:
    """Every evidence row of ``ref``."""
    commit = _git(git_dir, "rev-parse", f"{ref}^{{commit}}").strip()
    listing = _git(git_dir, "ls-tree", "-r", "--name-only", commit, "examples/tuning").splitlines()
    linked = sorted(p for p in listing if p.endswith("_fsdp_vllm.sh"))  # the FSDP + vLLM ones the doc lists
    rows: list[dict[str, str]] = []
    for path in linked:
        text = _git(git_dir, "show", f"{commit}:{path}")
        searches = list(_SEARCH.finditer(text))
        # A value the script's own search comment marks is judged by that mark (the 32B script keeps 45,
        # which its comment marks as not fitting), so the as-written row is only for scripts without one.
        if not any(s.group(3) in dict(_STEP.findall(s.group(4))) for s in searches):
            rows += _rows_for(
                text, path, commit, "docs/perf/device_tuning.rst: a configuration that ran", "fits", "", ""
            )
        for search in searches:
            indent, name, _, steps = search.groups()
            for value, mark in _STEP.findall(steps):
                changed = text[: search.start()] + f"{indent}{name}={value}" + text[search.end() :]
                verdict = "fits" if mark == FITS else "does not fit"
                rows += _rows_for(
                    changed, path, commit, f"binary-search comment: {value}{mark}", verdict, name, value
                )
    return rows


#: The commit that published docs/perf/dpsk.md's Qwen3-235B-A22B table with this revision of its script.
TABLE_COMMIT = "65c59c719c8ec4fa3a8b230215695ebc178a1b4e"
TABLE_SCRIPT = "examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh"
TABLE_MODEL = "Qwen/Qwen3-235B-A22B"
#: The table's rows: (GPUs, NNODES, TP, PP, EP, OFFLOAD_FRACTION, OPTIM_OFFLOAD). Its LAST_LAYER, 6, is left
#: at the script's default 10: 94 layers less 6 leave 88 for 7 stages, which megatron-core refuses
#: (``tests/fidelity/test_fidelity_megatron_vpp.py`` launches both).
TABLE = (
    (32, 4, 4, 8, 4, "1.", "False"),
    (64, 8, 4, 8, 4, "0.5", "True"),
    (128, 16, 4, 8, 4, "0", "True"),
    (256, 32, 4, 8, 4, "0", "True"),
)
TABLE_SETTING = ("NNODES", "TP", "PP", "EP", "OFFLOAD_FRACTION", "OPTIM_OFFLOAD")
#: ``+key`` overrides whose key verl 0.6.1's config already has (Hydra refuses the ``+`` there).
_KNOWN_PLUS = "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_"


def table_rows(git_dir: str) -> list[dict[str, str]]:
    """The table's rows at ``TABLE_COMMIT``: the script read with each row's environment (``HOME=/home/user``;
    the ``env.sh`` it sources when present is left out), the model path the catalog's id."""
    text = _git(git_dir, "show", f"{TABLE_COMMIT}:{TABLE_SCRIPT}")
    body = "\n".join(line for line in text.splitlines() if "env.sh" not in line)
    rows = []
    for gpus, *values in TABLE:
        env = dict(zip(TABLE_SETTING, map(str, values), strict=True))
        prelude = "".join(f"{k}={v}\n" for k, v in {"HOME": "/home/user", **env}.items())
        (found,) = invocations(prelude + body)
        args = _split_args(found.args)
        overrides = [f"--config-name={args['config_name']}"]
        for o in args["overrides"]:
            key = o.split("=", 1)[0]
            if key == "actor_rollout_ref.model.path":
                o = f"{key}={TABLE_MODEL}"
            overrides.append(o[1:] if o.startswith(_KNOWN_PLUS) else o)
        ran = " (runs on as few as 32 H20: the commit's 4-node training log)" if gpus == 32 else ""
        rows.append(
            {
                "id": f"{TABLE_SCRIPT}@{TABLE_COMMIT[:9]}#megatron@"
                + ";".join(f"{k}={v}" for k, v in env.items()),
                "source": "volcengine/verl",
                "commit": TABLE_COMMIT,
                "path": TABLE_SCRIPT,
                "evidence": f"docs/perf/dpsk.md at the table's revision: recommended setting for {gpus} GPUs{ran}; "
                "LAST_LAYER at the script's default 10",
                "setting": ";".join(TABLE_SETTING),
                "value": ";".join(env.values()),
                "verdict": "fits",
                "gpu_product": GPUS["h20"][0],
                "gpu_memory_mib": str(GPUS["h20"][1]),
                "nnodes": env["NNODES"],
                "gpus_per_node": "8",
                "model": TABLE_MODEL,
                "dataset": "dapo-math-17k",
                "overrides": json.dumps(overrides),
            }
        )
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", required=True)
    parser.add_argument("--ref", default="HEAD")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--table-rows", action="store_true", help="print dpsk.md's table rows (see the module)"
    )
    args = parser.parse_args(argv)
    if args.table_rows:
        writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
        writer.writerows(table_rows(args.git_dir))
        return 0
    if args.out is None:
        parser.error("--out is required")
    rows = evidence(args.git_dir, args.ref)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
