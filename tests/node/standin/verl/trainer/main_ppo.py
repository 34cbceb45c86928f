"""Stand-in for ``python3 -m verl.trainer.main_ppo`` in the node tier's test image.

It reads the planned overrides from argv, joins the Ray cluster through ``RAY_ADDRESS`` (as verl does),
checks that the cluster has the planned nodes and GPUs, prints verl-style progress lines and exits with
``STANDIN_VERL_EXIT`` (default 0). ``STANDIN_VERL_SLEEP`` seconds pass between the steps; on SIGTERM it
says so and exits 143.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from types import FrameType


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    del frame
    print("stand-in verl: received SIGTERM, stopping", flush=True)
    sys.exit(128 + signum)


def main() -> int:
    overrides = sys.argv[1:]
    settings = dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith("~"))
    nnodes = int(settings.get("trainer.nnodes", "0"))
    gpus_per_node = int(settings.get("trainer.n_gpus_per_node", "0"))
    import ray

    ray.init(logging_level=logging.ERROR, log_to_driver=False)
    alive = [n for n in ray.nodes() if n["Alive"]]
    resources = ray.cluster_resources()
    seen = {
        "overrides": overrides,
        "nnodes": nnodes,
        "gpusPerNode": gpus_per_node,
        "aliveNodes": len(alive),
        "nodeIps": sorted(n["NodeManagerAddress"] for n in alive),
        "gpus": resources.get("GPU", 0),
    }
    print("stand-in verl: " + json.dumps(seen, sort_keys=True), flush=True)
    ray.shutdown()
    # After ray.init/shutdown: Ray installs a SIGTERM handler of its own in a driver.
    signal.signal(signal.SIGTERM, _on_sigterm)
    if len(alive) != nnodes or seen["gpus"] != nnodes * gpus_per_node:
        print("stand-in verl: the Ray cluster does not match trainer.nnodes x trainer.n_gpus_per_node")
        return 3
    steps = 2
    print(f"Total training steps: {steps}", flush=True)
    for step in range(1, steps + 1):
        time.sleep(float(os.environ.get("STANDIN_VERL_SLEEP", "0.5")))
        print(
            f"step:{step} - timing_s/step:0.5 - perf/throughput:{100 + step}.0 - critic/score/mean:0.5",
            flush=True,
        )
    code = int(os.environ.get("STANDIN_VERL_EXIT", "0"))
    if code:
        print(f"stand-in verl: failing with exit code {code} as asked", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
