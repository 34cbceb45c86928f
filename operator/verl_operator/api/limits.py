"""Upper bounds of every number, list and string a VerlJob may carry (one source of truth).

The API models put them into the generated CRD (the API server rejects a value past them before the webhook
runs), and the planner applies the same bounds to values pinned through ``spec.overrides``, so the planner's
arithmetic always works on numbers of a few digits: admission stays fast whatever the input.

Each bound is far above anything verl runs today (the reason is given per bound) and low enough that the
largest products the planner forms (``trainBatchSize x rollout.n``, tokens per GPU) stay below 2**50.
"""

from __future__ import annotations

#: GPUs of one job: 2048 nodes of 8 GPUs (the largest public RL post-training runs use a few thousand).
MAX_GPUS = 16_384
#: GPUs on one node (8 today; 72 on a GB200 NVL72 rack seen as one node by some drivers).
MAX_GPUS_PER_NODE = 128
#: Prompts per step, mini- and micro-batches (verl's examples use 8 to 8192).
MAX_BATCH = 1_048_576
#: Responses per prompt (GRPO examples use 4 to 64).
MAX_ROLLOUT_N = 1_024
#: Rollout TP, Ulysses SP and expert parallel sizes (bounded by the GPUs; 1 to 64 in practice).
MAX_PARALLEL = 1_024
#: Prompt, response and model lengths in tokens (the longest-context models take 10M; RL uses up to 128k).
MAX_TOKENS = 16_777_216
#: Token budget per GPU with dynamic batch size (verl's examples use 8k to 64k).
MAX_TOKEN_BUDGET = 67_108_864
#: Sequences vLLM batches (max_num_seqs; 256 by default).
MAX_SEQS = 1_048_576
#: Whole-cluster restarts after failures.
MAX_BACKOFF = 1_000
#: Seconds (ten years) for activeDeadlineSeconds and ttlSecondsAfterFinished.
MAX_SECONDS = 315_360_000

# Model architecture numbers (the largest public models have 128 layers, hidden size 16384, vocab 256k).
MAX_LAYERS = 4_096
MAX_HIDDEN = 1_048_576
MAX_HEADS = 65_536
MAX_VOCAB = 16_777_216
MAX_EXPERTS = 65_536

# Lists and strings.
#: Raw verl overrides: verl's example scripts pass 20 to 80.
MAX_OVERRIDES = 256
#: One override ``key=value`` (a list of a few dozen file paths fits).
MAX_OVERRIDE_LENGTH = 2_048
#: Data files in trainFiles / valFiles: a sharded dataset listed shard by shard (verl's examples list 1 to 4;
#: more shards are usually one directory or glob).
MAX_FILES = 128
#: A path (model path, checkpoint directory); Linux PATH_MAX is 4096.
MAX_PATH = 4_096
#: One data file path or URL (object-store and HDFS URLs run to a few hundred characters); with ``MAX_FILES``
#: the two lists hold at most 256 KiB, so the bounded strings of a spec stay far below etcd's 1.5 MiB.
MAX_DATA_PATH = 1_024
#: A container image reference (registries limit the repository name to 255; a digest adds 72).
MAX_IMAGE = 1_024
#: A dotted Python module name (``spec.verl.entrypoint``); real ones are under 100 characters.
MAX_MODULE = 256
#: The text that says how a plan's measured rollout:trainer split was read (``plan.pools.splitBasis``).
MAX_SPLIT_BASIS = 512
#: A Kubernetes name (DNS subdomain) or label key with prefix.
MAX_NAME = 253
#: A label value.
MAX_LABEL_VALUE = 63
#: A resource quantity such as ``512Gi``.
MAX_QUANTITY = 64
#: Tolerations, volumes, mounts, node selector entries.
MAX_OBJECTS = 64
#: Environment variables (a verl job sets a handful: NCCL_*, VLLM_*, HF_* and a token from a Secret).
MAX_ENV = 128
#: The value of one environment variable (a JSON setting or a list of hosts fits; secrets come by valueFrom).
MAX_ENV_VALUE = 2_048
#: A label key with its DNS-subdomain prefix: ``<253>/<63>``.
MAX_LABEL_KEY = 317
#: Items of the small lists inside a security context (capabilities, sysctls, supplementalGroups).
MAX_SECURITY_ITEMS = 64
#: A Linux capability, sysctl name or SELinux field (the longest capability name has 18 characters, a
#: sysctl name a few dozen).
MAX_SECURITY_STRING = 256
#: A numeric user or group id (Kubernetes: 0 to 2**31-1).
MAX_ID = 2**31 - 1

# Resource quantities (parsed and bounded by ``api.quantity``; the schema checks the grammar only).
#: CPU cores of one Ray pod: the largest single nodes have a few thousand logical CPUs.
MAX_CPU_CORES = 65_536
#: Bytes of memory (and /dev/shm) of one Ray pod: 1 PiB, where the largest single nodes have tens of TiB.
MAX_MEMORY_BYTES = 2**50

#: A Kubernetes resource quantity without a sign (``16``, ``500m``, ``512Gi``, ``1e3``): the API server's own
#: grammar minus the leading sign, so a negative request is rejected at admission.
QUANTITY_PATTERN = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"

#: Bounds of the integer inputs without bounds of their own in ``api.settings_registry`` (any number the planner reads stays a few digits long).
DEFAULT_INT_BOUNDS = (-(2**31), 2**31 - 1)
