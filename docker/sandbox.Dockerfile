# The sandbox server alone: what the compose stack's sandbox services, a Nomad docker-driver job
# or any container platform runs. Only temporal_rollouts/__init__.py and the
# temporal_rollouts.sandbox_server package go in: it imports nothing else of the project, so the
# image needs none of the worker's dependencies, only its four (pinned), bubblewrap and libseccomp
# (for the sandbox's seccomp filter).
# Base pinned to an exact tag (no digest: these build machines cannot resolve one).
# Build from the repo root:
#   docker build -f docker/sandbox.Dockerfile -t rollouts-sandbox:local .
FROM python:3.11.9-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap libseccomp2 \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir --disable-pip-version-check \
    "uvicorn==0.54.0" "starlette==1.10.0" "pydantic==2.14.3" "pyseccomp==0.1.2"

WORKDIR /opt/sandbox
COPY temporal_rollouts/__init__.py temporal_rollouts/__init__.py
COPY temporal_rollouts/sandbox_server temporal_rollouts/sandbox_server
COPY docker/sandbox-entrypoint.sh /usr/local/bin/sandbox-entrypoint
ENV PYTHONPATH=/opt/sandbox PYTHONUNBUFFERED=1

# /data is every uid's: the compose stack runs each sandbox service as a uid of its own.
RUN useradd --create-home sandbox && mkdir /data && chown sandbox /data && chmod 1777 /data
USER sandbox
EXPOSE 8080
# With a token from the platform (Nomad Variables, Modal Secrets, Kubernetes): the server itself.
# The compose stack overrides the entrypoint with sandbox-entrypoint, which derives the token
# from the pool secret.
ENTRYPOINT ["python", "-m", "temporal_rollouts.sandbox_server"]
CMD ["--host", "0.0.0.0", "--port", "8080", "--root", "/data", "--token-env", "SANDBOX_TOKEN"]
