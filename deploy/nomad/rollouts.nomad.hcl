# The compose stack's workers and demo policy on a Nomad cluster, with sandbox servers started
# by the workers themselves through the `nomad` backend (one job `rollouts-sandbox-<i>` per
# container, image built from docker/sandbox.Dockerfile, token through a Nomad Variable).
#
# Temporal and S3 are not run here: point the variables at a Temporal cluster (or Temporal
# Cloud) that has the search attributes registered (docker/compose/register-search-attributes.sh
# or `temporal operator search-attribute create`, see temporal_rollouts/core/search_attributes.py)
# and at an S3 store with the bucket made.
#
# Secrets come from a Nomad Variable readable by this job, never from this file:
#   nomad var put nomad/jobs/rollouts \
#     pool_secret="$(openssl rand -hex 32)" nomad_token=<ACL token> \
#     aws_access_key_id=... aws_secret_access_key=...
# The workers' Nomad token needs: submit-job, read-job and list-jobs in the namespace, and
# write on variables under nomad/jobs/rollouts-sandbox-* (each sandbox job's token lives there).
#
# The worker image must hold the nomad backend's client:
#   docker build --build-arg EXTRAS=s3,cluster -t rollouts:local .
#   docker build -f docker/sandbox.Dockerfile -t rollouts-sandbox:local .
#
#   nomad job run -var temporal_address=temporal.internal:7233 -var s3_endpoint=http://s3.internal:9000 \
#     deploy/nomad/rollouts.nomad.hcl
#
# Not run here (no Nomad agent on the build machines); tests/unit/test_deploy_files.py checks
# that the workers' environment below is valid settings for the nomad backend.

variable "temporal_address" {
  type        = string
  description = "host:port of the Temporal frontend the workers use"
}

variable "s3_endpoint" {
  type        = string
  description = "S3 endpoint, e.g. http://minio.service.consul:9000; on AWS remove ROLLOUTS_STORAGE__ENDPOINT_URL below"
}

variable "worker_image" {
  type    = string
  default = "rollouts:local"
}

variable "sandbox_image" {
  type    = string
  default = "rollouts-sandbox:local"
}

variable "workers" {
  type    = number
  default = 3
}

variable "datacenter" {
  type    = string
  default = "dc1"
}

job "rollouts" {
  datacenters = [var.datacenter]
  type        = "service"

  group "policy" {
    count = 1

    network {
      port "http" { to = 8765 }
    }

    service {
      name     = "rollouts-policy"
      port     = "http"
      provider = "nomad"
      check {
        type     = "http"
        path     = "/v1/models"
        interval = "10s"
        timeout  = "2s"
      }
    }

    task "policy" {
      driver = "docker"
      config {
        image   = var.worker_image
        ports   = ["http"]
        command = "python"
        args    = ["-m", "temporal_rollouts.policy_servers.demo", "--host", "0.0.0.0", "--port", "8765"]
      }
      resources {
        cpu    = 500
        memory = 256
      }
    }
  }

  group "worker" {
    count = var.workers

    restart {
      attempts = 10
      interval = "10m"
      delay    = "15s"
      mode     = "delay"
    }

    task "worker" {
      driver = "docker"
      # Activities get worker.graceful_shutdown_s (30 s) to finish on SIGTERM.
      kill_timeout = "40s"

      config {
        image   = var.worker_image
        command = "python"
        args    = ["worker.py"]
      }

      env {
        ROLLOUTS_TEMPORAL__ADDRESS             = "${var.temporal_address}"
        # Per allocation: a batch's JSONL results land on the disk of the worker that ran its sink.
        # Mount one shared host volume here instead if you collect results from files, or use
        # the Atropos sink (`sink: atropos`), which posts groups over HTTP.
        ROLLOUTS_DATA_DIR                      = "/alloc/data"
        ROLLOUTS_STORAGE__TYPE                 = "s3"
        ROLLOUTS_STORAGE__ENDPOINT_URL         = "${var.s3_endpoint}"
        ROLLOUTS_STORAGE__REGION               = "us-east-1"
        ROLLOUTS_STORAGE__BUCKET               = "rollouts"
        ROLLOUTS_WORKER__HOST_NAME             = "${NOMAD_ALLOC_ID}"
        ROLLOUTS_SANDBOX__MIN_CONTAINERS       = "1"
        ROLLOUTS_SANDBOX__MAX_CONTAINERS       = "8"
        ROLLOUTS_SANDBOX__SLOTS_PER_CONTAINER  = "8"
        ROLLOUTS_SANDBOX__BACKEND              = "{\"type\": \"nomad\", \"address\": \"http://${attr.unique.network.ip-address}:4646\", \"driver\": \"docker\", \"image\": \"${var.sandbox_image}\", \"datacenter\": \"${var.datacenter}\", \"token_env\": \"NOMAD_TOKEN\", \"secret_env\": \"ROLLOUTS_SANDBOX_SECRET\", \"purge_job_on_start\": true}"
      }

      # The demo policy's address, and the secrets, rendered into the task's environment.
      template {
        destination = "local/policy.env"
        env         = true
        data        = <<-EOT
          {{ range nomadService "rollouts-policy" }}ROLLOUTS_DEFAULT_POLICY=http://{{ .Address }}:{{ .Port }}/v1{{ end }}
        EOT
      }

      template {
        destination = "secrets/rollouts.env"
        env         = true
        change_mode = "restart"
        data        = <<-EOT
          {{ with nomadVar "nomad/jobs/rollouts" }}
          ROLLOUTS_SANDBOX_SECRET={{ .pool_secret }}
          NOMAD_TOKEN={{ .nomad_token }}
          AWS_ACCESS_KEY_ID={{ .aws_access_key_id }}
          AWS_SECRET_ACCESS_KEY={{ .aws_secret_access_key }}
          {{ end }}
        EOT
      }

      resources {
        cpu    = 1000
        memory = 1024
      }
    }
  }
}
