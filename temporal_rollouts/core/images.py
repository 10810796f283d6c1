"""What an item's image is, as envs name it and as a build leaves it.

An item that names an image runs in it: its slots get that image's files as their root,
with a writable layer of their own. An env names either a build context (a folder with a
Dockerfile, built on the worker with buildah) or a reference to an image that is already
there (loaded into the store, or in a registry a remote backend pulls from). `ImageSpec`
is that choice, carried with the item; `BuiltImage` is what the build step hands on to the
slot step: the image's name in the store, the key slots are matched by, and the parts of
the image's own config a slot honours (its WORKDIR, environment and user).

The key of a build context is a digest of its content (`sandbox.images.context`), so the
same Dockerfile and files build once, however many rollouts, batches or workers ask, and
a changed file is a new image.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

IMAGE_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class ImageSpec(BaseModel):
    """The image an item runs in: a build context or a reference, never both."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    context: str | None = None
    """Absolute path of the build context folder, as every worker host sees it (like env files)."""
    dockerfile: str = "Dockerfile"
    """The Dockerfile, relative to `context`."""
    reference: str | None = None
    """An image already in the store or a registry, e.g. `localhost/swe/django:4.2` (no build)."""
    name: str | None = Field(default=None, pattern=IMAGE_NAME_PATTERN)
    """A readable name for the built image's tag (`localhost/rollouts/<name>:<key>`), e.g. the task's id;
    the context folder's name when unset."""
    build_timeout_s: float | None = Field(default=None, gt=0)
    """How long one build may take; the worker's `images.build_timeout_s` when unset."""

    @model_validator(mode="after")
    def _one_source(self) -> ImageSpec:
        if (self.context is None) == (self.reference is None):
            raise ValueError("an image names exactly one of `context` (a folder with a Dockerfile) and `reference`")
        if self.context is not None and not self.context.startswith("/"):
            raise ValueError(f"image context {self.context!r} must be an absolute path")
        if self.dockerfile.startswith("/") or ".." in self.dockerfile.split("/"):
            raise ValueError(f"dockerfile {self.dockerfile!r} must be a path inside the build context")
        return self

    def describe(self) -> str:
        """One short phrase for messages: the context folder or the reference."""
        return f"build context {self.context}" if self.context is not None else f"image {self.reference}"


class ImageConfig(BaseModel):
    """What an image says about how to run in it (its OCI config), as far as a slot honours it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workdir: str = "/"
    """The image's WORKDIR: where the agent's commands start."""
    env: list[str] = Field(default_factory=list)
    """The image's ENV as `NAME=value` lines (its PATH above all)."""
    user: str = ""
    """The image's USER; empty for root."""


class BuiltImage(BaseModel):
    """An image that is ready for slots: what the build step hands on to the slot step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(pattern=r"^[a-z0-9]{12,64}$")
    """What slots are matched by: the digest of a build context's content, or a reference's image id."""
    name: str
    """The image's name in the worker's store (or the registry a remote backend pulls from)."""
    image_id: str = ""
    """The store's id of the image (empty where a remote backend built it)."""
    config: ImageConfig = Field(default_factory=ImageConfig)
    built: bool = False
    """True when this step built it; False when it was found ready (the cache)."""
    build_s: float = 0.0
    """Seconds this step spent building (0 when it was found ready)."""
    remote: str | None = None
    """Where a remote backend finds it: a Modal image id, or the registry reference Nomad pulls."""

    @property
    def short(self) -> str:
        """The key as containers and people see it (12 characters)."""
        return self.key[:12]
