"""Hostile admission load: N concurrent VerlJob creates of many typo keys each, and a valid create sent beside
them, through the real API server and the operator's webhook.

Run: ``.venv/bin/python bench/bench_admission_load.py [--hostile 12] [--keys 256] [--rounds 5]``. Starts a
devcluster instance ``bench-admission`` (profile dgx-h100; removed at the end unless ``--keep``) and the
operator as a local process with its webhook, then per round: ``--hostile`` threads each create a VerlJob whose
overrides are ``--keys`` known verl 0.9 keys with their last letter changed (each is denied with suggestions),
and, once they are all in flight, one valid VerlJob is created (and deleted again). Prints per round the
valid create's round trip through the API server and the slowest hostile denial, then the median and worst.
The issue's target: the valid create answered within 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from bench_key_suggestions import typo_keys
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.jobs import verljob
from verl_devtools.devcluster.localrun import LocalOperator, install_crd

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
NAMESPACE = "default"
VERBOSE = False


def admission_job(name: str, overrides: list[str]) -> dict[str, Any]:
    # Suspended: admitted and planned, but holds no GPUs between rounds.
    return verljob(name, suspend=True, overrides=overrides)


def create(api: client.CustomObjectsApi, body: dict[str, Any]) -> tuple[float, int]:
    """Seconds for the create to be answered, and its HTTP status (201 created, 400 denied...)."""
    start = time.perf_counter()
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body, _request_timeout=60)
        status = 201
    except ApiException as exc:
        status = int(exc.status or 0)
        if VERBOSE:
            print(f"{body['metadata']['name']}: {status} {str(exc.body)[:300]}")
    return time.perf_counter() - start, status


def one_round(api: client.CustomObjectsApi, index: int, hostile: int, keys: list[str]) -> dict[str, float]:
    results: list[tuple[float, int]] = []
    lock = threading.Lock()
    started = threading.Barrier(hostile + 1)

    def attack(i: int) -> None:
        started.wait()
        outcome = create(api, admission_job(f"hostile-{index}-{i}", keys))
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=attack, args=(i,)) for i in range(hostile)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.05)  # the hostile requests are in flight
    valid_s, valid_status = create(api, admission_job(f"valid-{index}", []))
    for t in threads:
        t.join()
    if valid_status == 201:
        api.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, f"valid-{index}")
    assert valid_status == 201, f"the valid create was answered {valid_status}"
    denied = [s for _, s in results if s == 400 or s == 422]
    assert len(denied) == hostile, f"{hostile - len(denied)} hostile creates were admitted"
    return {"valid_s": valid_s, "hostile_max_s": max(s for s, _ in results)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostile", type=int, default=12)
    parser.add_argument("--keys", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="leave the devcluster instance running")
    args = parser.parse_args(argv)
    cluster = DevCluster(name="bench-admission", profile="dgx-h100", progress=print)
    cluster.up()
    operator: LocalOperator | None = None
    try:
        install_crd(cluster.kubeconfig)
        operator = LocalOperator(
            cluster.kubeconfig, Path(tempfile.mkdtemp()), webhook_name="bench-admission.verl-operator.io"
        ).start()
        api = client.CustomObjectsApi(cluster.api_client())
        keys = [f"{key}=1" for key in typo_keys(args.keys)]
        create(api, admission_job("warm-up", []))  # the webhook's first plan loads the catalog and key index
        api.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "warm-up")
        rounds = [one_round(api, i, args.hostile, keys) for i in range(args.rounds)]
        for i, r in enumerate(rounds):
            print(
                f"round {i}: valid create {r['valid_s'] * 1000:.0f} ms, slowest hostile {r['hostile_max_s'] * 1000:.0f} ms"
            )
        valid = [r["valid_s"] for r in rounds]
        hostile = [r["hostile_max_s"] for r in rounds]
        print(
            f"{args.hostile} concurrent creates of {args.keys} typo keys, {args.rounds} rounds: valid create "
            f"median {statistics.median(valid) * 1000:.0f} ms, worst {max(valid) * 1000:.0f} ms (target < 1000 ms); "
            f"slowest hostile denial median {statistics.median(hostile) * 1000:.0f} ms, "
            f"worst {max(hostile) * 1000:.0f} ms"
        )
    finally:
        if operator is not None:
            operator.stop()
        if not args.keep:
            cluster.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
