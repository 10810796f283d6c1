# The worker image: the project, bubblewrap for sandbox isolation, the S3 extra for MinIO.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap git && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir -e '.[s3]'
CMD ["python", "worker.py"]
