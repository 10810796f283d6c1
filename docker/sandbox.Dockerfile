# The sandbox server alone: what a Nomad docker-driver job (or any container platform) runs.
# Only the temporal_rollouts.sandbox_server package goes in: it imports nothing else of the
# project, so the image needs none of the worker's dependencies. Build from the repo root:
#   docker build -f docker/sandbox.Dockerfile -t rollouts-sandbox:local .
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir "uvicorn>=0.30" "starlette>=0.37" "pydantic>=2.7"

WORKDIR /opt/sandbox
COPY temporal_rollouts/__init__.py temporal_rollouts/__init__.py
COPY temporal_rollouts/sandbox_server temporal_rollouts/sandbox_server
ENV PYTHONPATH=/opt/sandbox PYTHONUNBUFFERED=1

RUN useradd --create-home sandbox && mkdir /data && chown sandbox /data
USER sandbox
EXPOSE 8080
ENTRYPOINT ["python", "-m", "temporal_rollouts.sandbox_server"]
CMD ["--host", "0.0.0.0", "--port", "8080", "--root", "/data", "--token-env", "SANDBOX_TOKEN"]
