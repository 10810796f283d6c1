# The worker image (also runs the demo policy and the `rollouts` CLI): the project with the S3
# extra for MinIO; `--build-arg EXTRAS=s3,cluster` adds the Nomad and Modal backends.
# Sandboxes run in their own image (docker/sandbox.Dockerfile), so no bubblewrap here. Base pinned to an exact tag (no digest: these build machines cannot resolve one).
FROM python:3.11.9-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
ARG EXTRAS=s3
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir ".[${EXTRAS}]" \
    && useradd --create-home rollouts && mkdir /data && chown rollouts /data
USER rollouts
ENV ROLLOUTS_DATA_DIR=/data
CMD ["python", "worker.py"]
