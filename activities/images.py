"""Make an item's image ready before its rollout takes a slot: a durable step of its own.

The step is the pool backend's build (`SandboxBackend.build_image`): locally buildah on this
host's store, keyed by the build context's content and locked per key, so concurrent rollouts of
one task build it once and a later batch builds nothing; remotely the backend's own image
service. It heartbeats while it builds, has a per-item timeout (the image's `build_timeout_s`,
enforced by the builder; the step's own timeout only bounds it from outside) and is retried when
the machinery failed. A Dockerfile that fails stops the rollout with `image_build_failed` and the
build log's tail: never scored, and resumable once the Dockerfile is fixed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from temporalio import activity

from temporal_rollouts.core.errors import activity_boundary
from temporal_rollouts.core.images import BuiltImage, ImageSpec
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.steps import heartbeating
from temporal_rollouts.sandbox.pool import SandboxPool


class BuildImageInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: ImageSpec
    item_id: str
    """The item that names it, for messages."""
    env: str = ""


class ImageActivities:
    def __init__(self, pool: SandboxPool) -> None:
        self._pool = pool

    @activity.defn(name="build_image")
    @checked_input
    async def build_image(self, input: BuildImageInput) -> BuiltImage:
        wanted_by = f"item {input.item_id!r}" + (f" of {input.env}" if input.env else "")
        with activity_boundary():
            return await heartbeating(self._pool.build_image(input.image, wanted_by))
