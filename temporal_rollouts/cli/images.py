"""`rollouts images`: the worker's image store, for people (its flags are in `cli/parsers.py`).

`list` shows what the store holds, `load` brings in a `podman save` archive (the way to
provide a base image no registry can serve here), `build` builds a context as a rollout would
(and says whether it was cached), `bootstrap` makes Debian's base image ready ahead of a batch.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from temporal_rollouts.core.images import ImageSpec
from temporal_rollouts.core.settings import Settings


async def cmd_images(args: argparse.Namespace, settings: Settings) -> int:
    from temporal_rollouts.sandbox.images.builder import ImageBuilder

    builder = ImageBuilder.from_settings(settings)
    console = Console()
    if args.images_command == "load":
        for name in await builder.store.load(Path(args.archive).resolve()):
            console.print(f"loaded {name}", soft_wrap=True)
        return 0
    if args.images_command == "bootstrap":
        image = await builder.ready(ImageSpec(reference="debian:bookworm-slim"), "rollouts images bootstrap")
        console.print(f"{image.name} is ready ({image.image_id[:12]})", soft_wrap=True)
        return 0
    if args.images_command == "build":
        spec = ImageSpec(context=str(Path(args.context).resolve()), dockerfile=args.dockerfile, name=args.name)
        image = await builder.ready(spec, str(args.context))
        if args.push:
            image = await builder.publish(image, args.push)
        if args.json:
            print(image.model_dump_json())
        else:
            how = f"built in {image.build_s:.1f}s" if image.built else "already built"
            console.print(f"{image.name} ({how})", soft_wrap=True)
            if image.remote:
                console.print(f"pushed with the sandbox server's layer: {image.remote}", soft_wrap=True)
        return 0
    images = await builder.store.listing()
    if args.json:
        print(json.dumps(images))
        return 0
    console.print(f"image store: {builder.store.root}", soft_wrap=True)
    table = Table("name", "id", "size (MB)", "created")
    for image in images:
        created = datetime.fromtimestamp(image.get("Created", 0)).isoformat(timespec="seconds")
        for name in image.get("Names") or ["<none>"]:
            table.add_row(name, image["Id"][:12], f"{image.get('Size', 0) / 1e6:.0f}", created)
    console.print(table)
    return 0
