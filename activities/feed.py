"""A training feed's steps that talk to the world: the object store (each finished group for the
trainer door), run-api (the trainer's progress, the env's registration, posting), the rollouts it
started (those whose end it was never told), and the check made before a run starts.

Posting happens once per group: a post whose answer was lost is retried only after asking run-api
whether the group it received last is this one (`group_overrides.group_id`), so a retry never
sends a group twice unless another group was posted in between (counted as not duplicated: the
check cannot tell, and a repeat only reweights the group).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Literal

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from activities.llm import FIRST_WEIGHTS, api_key, numeric_version
from activities.resume import run_result
from activities.sinks import results_path
from envs import get_env
from temporal_rollouts.core.errors import ConfigError, RolloutError, activity_boundary
from temporal_rollouts.core.feed import StaleGroups, TrainerView
from temporal_rollouts.core.forks import PrefixTokens
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.records import TrajectoryResult
from temporal_rollouts.core.settings import ChatPolicy, GeneratePolicy, Settings
from temporal_rollouts.llm.generate import GenerateClient
from temporal_rollouts.sinks.atropos_api import TrajectoryApi
from temporal_rollouts.sinks.groups import GroupBuilder, ScoredGroup
from temporal_rollouts.sinks.jsonl import append_once
from temporal_rollouts.sinks.templates import SftTemplates
from temporal_rollouts.storage.feed_groups import FeedGroupStore

POLL_S = 0.5
MASKED = -100


class FeedCheckInput(BaseModel):
    run: str
    api_url: str | None = None
    env: str
    env_config: dict = Field(default_factory=dict)
    policy: str | None = None
    tokenizer: str | None = None
    sink: Literal["door", "atropos", "jsonl"] = "door"
    output: str | None = None


class FeedCheck(BaseModel):
    allow_network: bool
    item_count: int | None
    output: str | None = Field(default=None, description="The JSONL file (sink jsonl), resolved in the results folder.")
    api_url: str | None = Field(default=None, description="The run-api this run talks to (sink atropos).")


class TrainerQuery(BaseModel):
    run: str
    api_url: str | None = None
    env_id: int | None = None
    group_size: int = 1
    max_token_length: int = 0
    env_weight: float = 1.0
    after_step: int | None = Field(
        default=None, description="Wait (up to wait_s) until the trainer passes this step..."
    )
    after_version: int | None = Field(
        default=None, description="...or the policy server serves other weights than these."
    )
    policy: str | None = Field(default=None, description="The run's policy, whose server says which weights it serves.")
    wait_s: float = 0.0


class FeedGroupInput(BaseModel):
    """One finished group of a training run, to post. The run's settings (`sink`, `max_staleness`,
    `stale_groups`) come from its FeedInput every time, so they have no default here: FeedInput's is the one."""

    run: str
    group_id: str
    results: list[TrajectoryResult]
    policy: str | None = None
    tokenizer: str | None = Field(default=None, description="The run's tokenizer, for a chat policy with none.")
    sink: Literal["door", "atropos", "jsonl"]
    output: str | None = None
    door_key: str | None = Field(default=None, description="The door: the object key the group is stored under.")
    api_url: str | None = None
    env_id: int | None = None
    max_token_length: int = 0
    max_staleness: int
    stale_groups: StaleGroups
    prefix_tokens: PrefixTokens | None = None


class FeedGroupOutcome(BaseModel):
    status: Literal["posted", "already_posted", "dropped"]
    reason: str | None = None
    staleness: int | None = None
    tokens_posted: int = 0
    masked: int = 0
    turns: int = 0


class RunsToCheck(BaseModel):
    runs: dict[str, str] = Field(description="Rollout id -> the run the feed waits to hear from.")


class FeedActivities:
    def __init__(self, settings: Settings, client: Client, groups: GroupBuilder, door: FeedGroupStore) -> None:
        self._settings = settings
        self._client = client
        self._groups = groups
        self._door = door
        self._templates = SftTemplates(settings)

    def _api(self, url: str | None) -> TrajectoryApi:
        return TrajectoryApi(url or self._settings.atropos.api_url, self._settings.atropos.timeout_s)

    @activity.defn(name="check_feed")
    @checked_input
    async def check_feed(self, input: FeedCheckInput) -> FeedCheck:
        """Refuse, before any rollout runs, a run that could never post: an unknown env or policy, or a
        policy that gives no token ids (a token-level policy does; a chat policy needs a tokenizer)."""
        with activity_boundary():
            env = get_env(input.env, input.env_config)
            endpoint = self._settings.policy_endpoint(input.policy)
            if isinstance(endpoint, ChatPolicy) and not (endpoint.tokenizer or input.tokenizer):
                name = input.policy or self._settings.default_policy
                raise ConfigError(
                    f"policy {name!r} gives no token ids: a training run needs a token-level policy (type sglang or "
                    f"vllm) or a chat policy with a tokenizer (policies.{name}.tokenizer, or the run's tokenizer) "
                    "for template-rendered tokens"
                )
            assert isinstance(endpoint, (ChatPolicy, GeneratePolicy))
            output = None
            if input.sink == "jsonl":
                path = results_path(self._settings.results_dir, input.output or f"{input.run}.jsonl", "output")
                path.parent.mkdir(parents=True, exist_ok=True)
                output = str(path)
            api_url = (input.api_url or self._settings.atropos.api_url) if input.sink == "atropos" else None
            return FeedCheck(
                allow_network=env.allow_network, item_count=env.item_count(), output=output, api_url=api_url
            )

    @activity.defn(name="trainer_view")
    @checked_input
    async def trainer_view(self, input: TrainerQuery) -> TrainerView:
        """The trainer's progress and this run's registration, registering (again, after run-api lost it)
        once a trainer has started; with `after_step`, waits until the trainer passes it or the policy
        server serves other weights than `after_version`."""
        with activity_boundary():
            deadline = time.monotonic() + input.wait_s
            server = version_client(self._settings.policy_endpoint(input.policy))
            async with (
                self._api(input.api_url) as api,
                contextlib.aclosing(server) if server else contextlib.nullcontext(),
            ):
                env_id = input.env_id
                while True:
                    view, registered = await _look(api, input, env_id)
                    # the served weights as a number of trainer steps; None (a chat policy, the weights the server
                    # started with, which no trainer published, the server down) leaves admission to run-api's
                    # figures alone
                    served = await server.served_version() if server else None
                    view.policy_version = numeric_version(served) if served != FIRST_WEIGHTS else None
                    env_id = view.env_id
                    if registered or trainer_moved(input, view) or time.monotonic() >= deadline:
                        return view
                    activity.heartbeat(view.current_step)
                    await asyncio.sleep(POLL_S)

    @activity.defn(name="post_feed_group")
    @checked_input
    async def post_feed_group(self, input: FeedGroupInput) -> FeedGroupOutcome:
        """Build the group (token ids, masks, logprobs, versions) and store it for the door, post it to
        run-api once, or write it to the JSONL file. Posted to run-api, a group staler than the bound is
        handled as `stale_groups` says; at the door, staleness is decided when a trainer takes it."""
        with activity_boundary():
            if input.sink == "jsonl":
                return await self._write(input)
            if input.sink == "door":
                return await self._store(input)
            async with self._api(input.api_url) as api:
                step = int((await api.status())["current_step"])
                limit = input.max_token_length or max(0, int((await api.trainer_info()).get("max_token_len", -1)) - 1)
                outcome, group = await self._build(input, step, limit)
                if group is None:
                    return outcome
                if activity.info().attempt > 1 and _carries(await api.latest_group(), input.group_id):
                    return outcome.model_copy(update={"status": "already_posted"})
                body = group.for_api()
                if input.env_id is not None:
                    body["env_id"] = input.env_id
                await api.post_group(body)
                return outcome

    async def _store(self, input: FeedGroupInput) -> FeedGroupOutcome:
        """Write the group under its key (a retry writes the same bytes again); the run's ledger keeps the key."""
        assert input.door_key is not None
        outcome, group = await self._build(input, None, input.max_token_length)
        if group is not None:
            await self._door.put(input.door_key, group.model_dump())
        return outcome

    async def _write(self, input: FeedGroupInput) -> FeedGroupOutcome:
        assert input.output is not None
        outcome, group = await self._build(input, None, input.max_token_length)
        assert group is not None
        written = await asyncio.to_thread(
            append_once,
            results_path(self._settings.results_dir, input.output, "output"),
            input.group_id,
            group.model_dump_json(),
        )
        return outcome if written else outcome.model_copy(update={"status": "already_posted"})

    async def _build(
        self, input: FeedGroupInput, step: int | None, limit: int
    ) -> tuple[FeedGroupOutcome, ScoredGroup | None]:
        results = input.results
        oldest = [r.version_range()[0] if r.version_range() else None for r in results]
        known = [v for v in oldest if v is not None]
        staleness = step - min(known) if step is not None and known else None
        turns = sum(r.turns for r in results)
        stale = staleness is not None and staleness > input.max_staleness
        if stale and input.stale_groups == StaleGroups.DROP:
            return FeedGroupOutcome(status="dropped", reason="stale", staleness=staleness, turns=turns), None
        try:
            group = await self._groups.build(
                input.group_id,
                results,
                max_token_length=limit,
                sft_template=await self._templates.for_policy(input.policy, input.tokenizer),
                prefix_tokens=input.prefix_tokens,
            )
        except RolloutError:
            raise
        except Exception as err:  # a template or trace that cannot render: retrying renders it the same way
            raise ConfigError(f"cannot build group {input.group_id}: {type(err).__name__}: {err}") from err
        masked = 0
        if stale and input.stale_groups == StaleGroups.SCORES_ONLY:
            assert step is not None
            for index, version in enumerate(oldest):
                if version is not None and step - version > input.max_staleness:
                    group.masks[index] = [MASKED] * len(group.masks[index])
                    masked += 1
        _carry_versions(group, input.group_id, results, staleness)
        if not any(any(m != MASKED for m in mask) for mask in group.masks):
            reason = "all_masked" if masked else "no_tokens"
            return FeedGroupOutcome(
                status="dropped", reason=reason, staleness=staleness, masked=masked, turns=turns
            ), None
        tokens = sum(sum(1 for m in mask if m != MASKED) for mask in group.masks)
        outcome = FeedGroupOutcome(
            status="posted",
            reason="stale" if stale else None,
            staleness=staleness,
            tokens_posted=tokens,
            masked=masked,
            turns=turns,
        )
        return outcome, group

    @activity.defn(name="check_feed_rollouts")
    @checked_input
    async def check_feed_rollouts(self, input: RunsToCheck) -> list[TrajectoryResult]:
        """The results of rollouts whose runs closed without telling the feed (terminated, timed out,
        or their signal raced the feed's continue-as-new and was refused)."""
        with activity_boundary():
            closed: list[TrajectoryResult] = []
            for rollout_id, run_id in input.runs.items():
                handle = self._client.get_workflow_handle(rollout_id, run_id=run_id)
                try:
                    described = await handle.describe()
                except RPCError:
                    continue
                if described.status == WorkflowExecutionStatus.RUNNING:
                    continue
                result = await run_result(self._client, rollout_id, run_id)
                if result is not None:
                    closed.append(result.model_copy(update={"run_id": run_id}))
                activity.heartbeat(rollout_id)
            return closed


def trainer_moved(query: TrainerQuery, view: TrainerView) -> bool:
    """What a wait for the trainer (`after_step`) ends on, besides this run registering (again, `_look`): the
    trainer passed that step, the policy server serves other weights, or run-api restarted (its step went
    back, or it holds no registration of this run any more), where the run's view of the queue is wrong
    until it takes this one."""
    if query.after_step is None:
        return True
    return (
        view.current_step != query.after_step
        or (view.policy_version is not None and view.policy_version != query.after_version)
        or (query.env_id is not None and view.env_id != query.env_id)
    )


async def _look(api: TrajectoryApi, query: TrainerQuery, env_id: int | None) -> tuple[TrainerView, bool]:
    """run-api's view, and whether this run registered with it now (the first time, or again after a
    restarted run-api lost the registration: its queue then starts empty)."""
    info = await api.trainer_info()
    status = await api.status()
    view = TrainerView(
        registered=int(info.get("batch_size", -1)) > 0,
        current_step=int(status.get("current_step", 0)),
        batch_size=int(info.get("batch_size", -1)),
        max_token_len=int(info.get("max_token_len", -1)),
    )
    if not view.registered:
        return view, False
    if env_id is not None:
        seen = await api.env_status(env_id)
        if seen is not None:
            return view.model_copy(update={"env_id": env_id, "queued": int(seen.get("self_queue_size", 0))}), False
    limit = query.max_token_length or max(view.max_token_len, 1)
    registered = await api.register_env(query.run, limit, query.group_size, query.env_weight)
    if registered.get("status") != "success":
        return view, False
    view.env_id = int(registered["env_id"])
    return view, True


def version_client(endpoint: ChatPolicy | GeneratePolicy) -> GenerateClient | None:
    """A client for asking a token-level policy's server which weights it serves; None for a chat policy."""
    if not isinstance(endpoint, GeneratePolicy):
        return None
    return GenerateClient(endpoint.base_url, endpoint.type, api_key(endpoint), max_connections=1)


def _carries(latest: dict, group_id: str) -> bool:
    overrides = latest.get("group_overrides") if isinstance(latest, dict) else None
    return isinstance(overrides, dict) and overrides.get("group_id") == group_id


def _carry_versions(group: ScoredGroup, group_id: str, results: list[TrajectoryResult], staleness: int | None) -> None:
    """The versions travel in the two fields run-api keeps: per sequence in `overrides`, per group in
    `group_overrides` (with the group id that makes a lost post safe to retry)."""
    ranges = [r.version_range() for r in results]
    known = [v for r in ranges if r for v in r]
    group.group_overrides = {
        **(group.group_overrides or {}),
        "group_id": group_id,
        "staleness": staleness,
        "policy_version_min": min(known) if known else None,
        "policy_version_max": max(known) if known else None,
    }
    group.overrides = [
        {**override, "policy_versions": result.policy_versions}
        for override, result in zip(group.overrides or [{} for _ in results], results, strict=True)
    ]
    group.metadata["policy_versions"] = [result.policy_versions for result in results]
    group.metadata["staleness"] = staleness
