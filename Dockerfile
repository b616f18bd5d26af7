# lstar-monitor: the unattended watcher (`lstar run`) on a CUDA-capable PyTorch runtime: torch is
# the version the README installs and CI tests (its PyPI wheel for Linux brings the CUDA libraries).
#
# The scoring corpus is not in the image: mount it read-only at /app/corpus (the default
# --corpus is /app/corpus/calib-v0). The API listens on every interface of the container
# (--api-host 0.0.0.0) so a published port reaches it; reads then need the token in
# /app/state/api.token, as writes always do, and Host must be 127.0.0.1 or localhost.
#
#   docker build -t lstar-monitor .
#   docker run --gpus all -v lstar-state:/app/state -v hf-cache:/home/lstar/.cache/huggingface \
#       -v $PWD/policies:/app/policies:ro -v $PWD/../shared/corpus:/app/corpus:ro \
#       -p 127.0.0.1:8787:8787 lstar-monitor
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    DISABLE_SAFETENSORS_CONVERSION=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    HF_HOME=/home/lstar/.cache/huggingface \
    LSTAR_API_PORT=8787

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin lstar
WORKDIR /app

# torch first and pinned, as the README and CI install it (cached while only the code changes).
RUN pip install --no-cache-dir "torch==2.13.0"
COPY pyproject.toml README.md ./
COPY monitor ./monitor
COPY policies ./policies
RUN pip install --no-cache-dir . \
    && mkdir -p /app/state /app/corpus "$HF_HOME" \
    && chown -R lstar:lstar /app/state /home/lstar

USER lstar
VOLUME ["/app/state", "/home/lstar/.cache/huggingface"]

# The daemon's local API answers /health with 200 while its jobs are alive, and 503 while it is
# unhealthy or degraded (a policy task its scoring settings can never evaluate).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import os, urllib.request, sys; \
url = 'http://127.0.0.1:%s/health' % os.environ.get('LSTAR_API_PORT', '8787'); \
sys.exit(0 if urllib.request.urlopen(url, timeout=4).status == 200 else 1)"

ENTRYPOINT ["lstar", "run"]
CMD ["--policies", "/app/policies", "--state", "/app/state", "--corpus", "/app/corpus/calib-v0", \
     "--api-host", "0.0.0.0", "--api-port", "8787"]
