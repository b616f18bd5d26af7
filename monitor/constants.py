"""Values both the command line and the stages need, in a module that imports nothing.

`lstar --help` prints these (a flag's range, a default file name, a `--dtype` choice); the
stages that use them (`monitor.scoring.precision`, `monitor.service.settings`, the daemon, the
store) import them from here too, so the help and the code cannot disagree, and printing the
help does not import the stage (duckdb, pydantic, the daemon) that owns the value.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, get_args

# -- time ----------------------------------------------------------------------------------------
DAY_S = 86400.0

# -- precision (`monitor.scoring.precision` holds the rule that resolves `auto`) -----------------
# The choices of every --dtype option and campaign `scoring.dtype` (written once), and the
# dtypes a score can run in.
DTypeChoice = Literal["auto", "float32", "bfloat16", "float16"]
DTYPE_CHOICES: tuple[str, ...] = get_args(DTypeChoice)
DTYPES = DTYPE_CHOICES[1:]
DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
                 "float16": "float16", "fp16": "float16", "half": "float16"}
# --device: auto, cpu, cuda or cuda:N (checked when parsed; availability when used).
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda|cuda:[0-9]{1,3}")
# Compute capability from which a GPU computes in bf16 natively (Ampere).
BF16_NATIVE_MAJOR = 8
# What "the hardware is not known here" means for an auto dtype on CUDA (a Ray worker seen
# from the daemon): the wider float32, so an estimate built on it is never too small.
UNKNOWN = "unknown"
Capability = tuple[int, int]

# -- scoring -------------------------------------------------------------------------------------
DEFAULT_MODEL = "builtin:smollm2-135m"   # `lstar score` without a model
DEFAULT_CORPUS_DIR = Path("../shared/corpus/calib-v0")   # the pinned calibration corpus, beside the checkout

# -- the Hub download cache (`monitor.hub.cache_prune`) ------------------------------------------
DEFAULT_KEEP_LAST = 3
DEFAULT_MAX_BYTES = 50 << 30

# -- the daemon's settings (`monitor.service.settings`) ------------------------------------------
MAX_BATCH = 4096              # windows per forward pass
MAX_RESAMPLES = 100_000       # bootstrap resamples

# -- the state file (`monitor.store`) ------------------------------------------------------------
DB_NAME = "lstar.duckdb"      # the database file in a state directory
DEFAULT_LIMIT = 50            # rows in one page of a listing when --limit is not given
MAX_LIMIT = 1000              # the largest page (`limit`) a listing of the API, or of a command, answers
