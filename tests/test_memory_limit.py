"""`--score-memory` too small to load the scoring libraries: refused when `lstar run` starts.

The probe is a real child process under a real address-space limit, and the command is the
real CLI entry point.
"""

from __future__ import annotations

import pytest

from monitor.cli import main
from monitor.errors import SpecError
from monitor.scoring import memory_limit
from monitor.scoring.memory_limit import check_score_memory, is_memory_failure

pytestmark = pytest.mark.slow  # the daemon or the scoring stack in subprocesses


@pytest.fixture(scope="module")
def unlimited_probe() -> memory_limit.ProbeResult:
    """What the probe child measures without a limit: the machine's need, the same for every
    test here. Measured once for the module (a child importing torch and transformers, about
    8 CPU-seconds each, 18.5 for the file when each test measured it)."""
    return memory_limit.probe(None)


@pytest.fixture
def measured_once(unlimited_probe, monkeypatch):
    """`check_score_memory`'s probe without a limit answers the module's measurement; a probe
    under a limit still runs its own child."""
    real = memory_limit.probe

    def probe(memory_bytes, **kwargs):
        return unlimited_probe if memory_bytes is None else real(memory_bytes, **kwargs)

    monkeypatch.setattr(memory_limit, "probe", probe)


def test_lstar_run_refuses_a_score_memory_too_small_to_load_torch(tmp_path, capsys, measured_once):
    policies = tmp_path / "policies"
    policies.mkdir()
    state = tmp_path / "state"
    code = main(["run", "--policies", str(policies), "--state", str(state), "--once",
                 "--endpoint", "http://127.0.0.1:9", "--score-memory", "300M"])
    err = capsys.readouterr().err
    assert code == SpecError.exit_code
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: --score-memory 300 MiB is too small: a scoring child needs about ")
    assert "of address space to load torch and transformers on this machine (measured); give --score-memory " \
           "more than that" in lines[0]
    assert not state.exists()                      # refused before anything was written


def test_no_limit_is_not_probed_and_a_large_one_passes(measured_once):
    assert check_score_memory(None) is None
    probed = check_score_memory(4 << 30)
    assert probed is not None and probed.ok
    assert probed.peak_bytes is not None and 0 < probed.peak_bytes < 4 << 30   # what the imports took


@pytest.mark.parametrize("text, memory", [
    ("ImportError: libtorch_cpu.so: failed to map segment from shared object", True),
    ("terminate called after throwing an instance of 'std::bad_alloc'", True),
    ("OpenBLAS error: Memory allocation still failed after 10 retries, giving up.", True),
    ("OSError: [Errno 12] Cannot allocate memory", True),
    ("MemoryError", True),
    ("ModuleNotFoundError: No module named 'optimum'", False),
    ("ImportError: cannot import name 'Foo' from 'transformers'", False),
])
def test_what_counts_as_running_out_of_memory(text, memory):
    assert is_memory_failure(text) is memory
