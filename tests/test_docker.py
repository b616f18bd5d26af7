"""The Docker image builds where Docker works; elsewhere the test says precisely why it skipped."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def _docker_unavailable() -> str | None:
    """Why `docker build` cannot run here, or None when it can."""
    docker = shutil.which("docker")
    if docker is None:
        return "no `docker` executable on PATH"
    try:
        info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker info` failed to run: {exc}"
    if info.returncode != 0:
        first = (info.stderr or info.stdout).strip().splitlines()
        return f"`docker info` exited {info.returncode}: {first[0] if first else 'no output'} (no usable Docker daemon)"
    return None


def test_dockerfile_declares_the_service_contract() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^FROM (\S+)", text, re.M).group(1)
    assert base.startswith("pytorch/pytorch:") and "cuda" in base and "runtime" in base
    assert re.search(r"^USER (?!root)\S+", text, re.M), "the image must not run as root"
    assert 'VOLUME ["/app/state", "/home/lstar/.cache/huggingface"]' in text
    assert "HEALTHCHECK" in text and "/health" in text
    assert 'ENTRYPOINT ["lstar", "run"]' in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "state" in ignored and ".git" in ignored


@pytest.mark.slow
def test_docker_build() -> None:
    reason = _docker_unavailable()
    if reason is not None:
        pytest.skip(f"docker build not attempted: {reason}")
    proc = subprocess.run(["docker", "build", "-t", "lstar-monitor:test", str(ROOT)], capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0 and re.search(r"(pull access denied|failed to resolve source metadata|"
                                          r"dial tcp|no such host|TLS handshake timeout|i/o timeout)",
                                          proc.stderr + proc.stdout):
        pytest.skip("docker build not attempted: Docker works but the base image "
                    "pytorch/pytorch cannot be pulled from Docker Hub (no registry access)")
    assert proc.returncode == 0, proc.stderr[-3000:]
