"""A stand-in for ``python3 -m verl.trainer.main_ppo``: records its argv and environment, prints metric
lines in verl's console format, optionally joins the Ray cluster like verl does, then exits.

Controlled by environment variables (the tests pass them through the launch spec's ``env``):
FAKE_VERL_RECORD (file for the JSON record), FAKE_VERL_EXIT (exit code), FAKE_VERL_SLEEP (seconds to
run before exiting), FAKE_VERL_RAY_INIT (``1``: ``ray.init()`` through RAY_ADDRESS and record the
cluster's resources).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time


def main() -> int:
    record: dict[str, object] = {"argv": sys.argv[1:], "env": dict(os.environ), "pid": os.getpid()}
    print("Total training steps: 2", flush=True)
    if os.environ.get("FAKE_VERL_RAY_INIT") == "1":
        import ray

        ray.init(
            logging_level=logging.ERROR, log_to_driver=False
        )  # the address comes from RAY_ADDRESS, as in verl
        resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
        record["clusterResources"] = {k: v for k, v in resources.items() if k in ("GPU", "CPU")}
        record["aliveNodes"] = len([n for n in ray.nodes() if n["Alive"]])  # type: ignore[no-untyped-call]
        ray.shutdown()
    path = os.environ.get("FAKE_VERL_RECORD")
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
    # verl's console logger format, once plain and once as it arrives from the TaskRunner actor.
    print("step:1 - timing_s/step:1.5 - perf/throughput:100.25 - critic/score/mean:0.5", flush=True)
    print(
        "\x1b[36m(TaskRunner pid=77)\x1b[0m step:2 - timing_s/step:1.25 - perf/throughput:np.float64(120.5)",
        flush=True,
    )
    time.sleep(float(os.environ.get("FAKE_VERL_SLEEP", "0")))
    return int(os.environ.get("FAKE_VERL_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main())
