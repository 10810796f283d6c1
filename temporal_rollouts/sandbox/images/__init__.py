"""Item images on the worker's host: the store, base images, build contexts, builds.

Built with the ecosystem's tools, never by hand: buildah builds (`builder`), podman keeps and
mounts (`store`), mmdebstrap bootstraps the one base image a host without a registry needs
(`base_images`). A build's RUN steps reach only the package mirrors (`build_network`). The
models every layer shares (`ImageSpec`, `BuiltImage`) are in `temporal_rollouts.core.images`.
"""
