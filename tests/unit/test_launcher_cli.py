"""The CLI without Ray: probe output and node labelling (a real local HTTP server stands in for the API
server), attempt parsing, child process handling."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from verl_launcher import cli
from verl_launcher.labels import NVLINK_DOMAIN_LABEL, build_patch, in_cluster_api_server
from verl_launcher.processes import Child

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"


@pytest.fixture
def probe_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    query = tmp_path / "query.csv"
    query.write_text("".join(f"{i}, NVIDIA A100 80GB PCIe, 81920 MiB\n" for i in range(4)))
    monkeypatch.setenv("VERL_LAUNCHER_GPU_QUERY_FILE", str(query))
    monkeypatch.setenv(
        "VERL_LAUNCHER_TOPO_FILE", str(FIXTURES / "a100_pcie_4gpu_nvlink_bridge_pairs_nv12.txt")
    )
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    return tmp_path


def test_probe_labels_format(probe_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["probe", "--format", "labels"]) == 0
    assert capsys.readouterr().out == f"{NVLINK_DOMAIN_LABEL}=2\n"


def test_probe_json_format(probe_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["probe"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpuCount"] == 4 and doc["nvlinkDomainSize"] == 2
    assert [d["gpus"] for d in doc["nvlinkDomains"]] == [[0, 1], [2, 3]]


def test_print_patch(
    probe_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert cli.main(["probe", "--format", "labels", "--print-patch"]) == 0
    out = capsys.readouterr().out
    patch = json.loads(out[out.index("{") :])
    assert patch == {
        "method": "PATCH",
        "url": "https://10.96.0.1:443/api/v1/nodes/gpu-node-7",
        "contentType": "application/merge-patch+json",
        "body": {"metadata": {"labels": {NVLINK_DOMAIN_LABEL: "2"}}},
    }


def test_label_node_needs_a_node_name(probe_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME")
    assert cli.main(["probe", "--label-node", "--api-server", "http://127.0.0.1:9"]) == 1


def test_api_server_from_env() -> None:
    assert in_cluster_api_server(
        {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    ) == ("https://[fd00::1]:6443")
    with pytest.raises(RuntimeError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster_api_server({})


def test_node_name_is_quoted() -> None:
    assert build_patch("https://api", "a/b", {}).url == "https://api/api/v1/nodes/a%2Fb"


class _Recorder(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []
    status = 200

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests.append(
            {"path": self.path, "type": self.headers["Content-Type"], "auth": self.headers.get("Authorization"),
             "body": json.loads(body)}
        )  # fmt: skip
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@pytest.fixture
def api_server() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"requests": [], "status": 200})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_label_node_sends_the_patch(
    probe_env: Path, api_server: tuple[str, type[_Recorder]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, handler = api_server
    token_dir = probe_env / "sa"
    token_dir.mkdir()
    (token_dir / "token").write_text("secret-token\n")
    monkeypatch.setattr("verl_launcher.labels.SERVICE_ACCOUNT_DIR", token_dir)
    assert cli.main(["probe", "--format", "labels", "--label-node", "--api-server", url]) == 0
    assert handler.requests == [
        {"path": "/api/v1/nodes/gpu-node-7", "type": "application/merge-patch+json", "auth": "Bearer secret-token",
         "body": {"metadata": {"labels": {NVLINK_DOMAIN_LABEL: "2"}}}},
    ]  # fmt: skip


def test_label_node_reports_a_refusal(
    probe_env: Path, api_server: tuple[str, type[_Recorder]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, handler = api_server
    handler.status = 403
    assert cli.main(["probe", "--label-node", "--api-server", url]) == 1
    assert "refused the label patch: 403" in capsys.readouterr().err


def test_probe_failure_does_not_label(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VERL_LAUNCHER_NVIDIA_SMI", str(tmp_path / "absent"))
    monkeypatch.delenv("VERL_LAUNCHER_FAKE_GPUS", raising=False)
    monkeypatch.delenv("VERL_LAUNCHER_GPU_QUERY_FILE", raising=False)
    assert cli.main(["probe", "--print-patch", "--node-name", "n", "--api-server", "http://x"]) == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("", 0, id="empty"),
        pytest.param("3", 3, id="three"),
        pytest.param("-1", None, id="negative"),
        pytest.param("x", None, id="text"),
    ],
)
def test_attempt(value: str, expected: int | None) -> None:
    if expected is None:
        with pytest.raises(cli.LauncherError, match="VERL_OPERATOR_ATTEMPT"):
            cli._attempt({"VERL_OPERATOR_ATTEMPT": value})
    else:
        assert cli._attempt({"VERL_OPERATOR_ATTEMPT": value}) == expected


def test_role_with_a_bad_spec_writes_the_termination_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.setenv("VERL_LAUNCHER_TERMINATION_LOG", str(log))
    monkeypatch.setenv("VERL_LAUNCHER_FAKE_GPUS", "1")
    assert cli.main(["worker", "--spec", str(tmp_path / "none.json")]) == 2
    assert json.loads(log.read_text())["reason"] == "InvalidLaunchSpec"


def test_child_streams_lines_and_extra_output(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    with out.open("w") as handle:
        child = Child(
            [sys.executable, "-c", "print('a'); print('step:1 - x:2'); import sys; sys.exit(4)"],
            env={"PYTHONUNBUFFERED": "1"},
            prefix="> ",
            on_line=lambda line: "EXTRA" if line.startswith("step:") else None,
            out=handle,
        )
        assert child.wait(30) == 4
    assert out.read_text() == "> a\n> step:1 - x:2\nEXTRA\n"


def test_child_stop_kills_the_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "time.sleep(600)\n"
    )
    child = Child([sys.executable, "-c", script], env={}, out=(tmp_path / "o").open("w"))
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    started = time.monotonic()
    assert child.stop(grace_s=1.0) == -9  # SIGTERM ignored, so SIGKILL after the grace
    assert time.monotonic() - started < 10
    time.sleep(0.2)
    status = Path(f"/proc/{grandchild}/status")
    assert not status.exists() or "zombie" in status.read_text()


def write_spec(path: Path, port: int, timeouts: float = 3) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "verl-operator.io/v1alpha1",
                "kind": "LaunchSpec",
                "job": {"name": "j", "namespace": "n"},
                "verlVersion": "0.9",
                "nnodes": 1,
                "gpusPerNode": 1,
                "head": {"host": "127.0.0.1", "port": port},
                "entrypoint": ["python3"],
                "timeouts": {"clusterReadySeconds": timeouts, "workerJoinSeconds": timeouts},
            }
        )
    )
    return path


@pytest.fixture
def role_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VERL_LAUNCHER_TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.setenv("VERL_LAUNCHER_FAKE_GPUS", "1")
    return tmp_path


def test_head_without_a_ray_executable_is_cluster_not_ready(role_env: Path) -> None:
    spec = write_spec(role_env / "launch.json", port=1)
    assert cli.main(["head", "--spec", str(spec), "--ray-executable", str(role_env / "no-ray")]) == 13
    doc = json.loads((role_env / "termination-log").read_text())
    assert (
        doc["reason"] == "ClusterNotReady" and "cannot start" in doc["message"] and "no-ray" in doc["message"]
    )


def test_worker_without_a_ray_executable_is_head_unreachable(role_env: Path) -> None:
    import socket

    with socket.socket() as listener:  # the head's port answers, so the worker gets as far as `ray start`
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        spec = write_spec(role_env / "launch.json", port=listener.getsockname()[1])
        assert cli.main(["worker", "--spec", str(spec), "--ray-executable", str(role_env / "no-ray")]) == 14
    doc = json.loads((role_env / "termination-log").read_text())
    assert doc["reason"] == "HeadUnreachable" and "to join the head" in doc["message"]


def test_unexpected_errors_are_reported(role_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "run_worker", broken)
    spec = write_spec(role_env / "launch.json", port=1)
    assert cli.main(["worker", "--spec", str(spec)]) == 1
    doc = json.loads((role_env / "termination-log").read_text())
    assert doc == {"reason": "LauncherFailed", "message": "unexpected launcher error: RuntimeError: boom"}
