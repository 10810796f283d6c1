"""An atroposlib `BaseEnv` whose work is a durable training feed and Temporal workflows.

    python -m temporal_rollouts.integrations.atropos.env serve    --env.task_env terminal_tasks --env.policy smol ...
    python -m temporal_rollouts.integrations.atropos.env process  --env.data_path_to_save_groups out/groups.jsonl ...
    python -m temporal_rollouts.integrations.atropos.env evaluate --env.data_dir_to_save_evals out/evals ...

`serve` starts the training run `run_name` (a `TrainingFeedWorkflow`, workflows/feed.py) or, when
it already runs, attaches to it: the feed itself registers with `run-api`, keeps groups in flight
within the staleness bound, resumes what the machinery failed and posts each group once, so this
process holds nothing. Killed and started again, it finds the same run by name and loses nothing.
It reports the run's figures (and to wandb), stops the run once the trainer has taken
`total_steps` steps, and exits when the run ends. `process` runs a feed that writes
`total_steps` groups to JSONL (the SFT-data path: a chat policy with a tokenizer gives
template-rendered tokens and masks), then copies them to `data_path_to_save_groups` with
Atropos' HTML view. `evaluate` runs `eval_items` rollouts at the eval temperature.

A mode that needs what the policy cannot give (token ids for `serve` and `process`) fails at
start in one line. The policy is named, not described: the workers resolve it from their own
settings, so endpoints and keys never pass through Atropos flags or workflow histories.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig
from pydantic import Field
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

from envs import get_env
from envs.base import as_loaded
from envs.sources import load_env_sources
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import ConfigError, RolloutError
from temporal_rollouts.core.feed import FeedInput, FeedStatus, StaleGroups
from temporal_rollouts.core.inputs import field_default
from temporal_rollouts.core.records import (
    RolloutLimits,
    Sampling,
    TrajectoryInput,
    TrajectoryResult,
    failed_rollout_result,
)
from temporal_rollouts.core.settings import ChatPolicy, Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.door.client import door_metrics
from temporal_rollouts.integrations.atropos.wandb_rollouts import rollouts_for_table
from temporal_rollouts.runtime.temporal import connect
from temporal_rollouts.sinks.atropos_api import TrajectoryApi
from temporal_rollouts.storage.objects import object_client
from temporal_rollouts.tools.toolsets import resolve_tools

log = logging.getLogger("temporal_rollouts.atropos")

UNUSED_SERVER = "http://127.0.0.1:9/v1"
"""atroposlib insists on an inference server config; ours are the workers' policies, so this one is never called."""
POLICY_TOKENIZER = "policy"
"""`tokenizer_name`'s default: the named policy's own tokenizer (never a model hub)."""
WATCH_EVERY_S = 5.0


class TemporalRolloutsEnvConfig(BaseEnvConfig):
    task_env: str = Field(default="terminal_tasks", description="Our env (task family) the items come from.")
    env_config: dict[str, Any] = Field(default_factory=dict, description="Config of that env.")
    policy: str | None = Field(
        default=None, description="Policy name in the workers' settings; their default when unset."
    )
    max_agent_turns: int = Field(
        default=field_default(RolloutLimits, "max_turns"), description="Model turns before a rollout stops."
    )
    max_tool_calls: int = Field(
        default=field_default(RolloutLimits, "max_tool_calls"), description="Tool calls before a rollout stops."
    )
    agent_temperature: float = Field(
        default=field_default(Sampling, "temperature"), description="Sampling temperature of every turn."
    )
    agent_max_tokens: int | None = Field(
        default=None, description="Per-turn generation cap; None leaves it to the context budget."
    )
    tool_call_parser: str | None = Field(
        default=None, description="Overrides the policy's tool-call parser (hermes, qwen3_coder, ...)."
    )
    enabled_toolsets: list[str] | None = Field(default=None, description="Toolsets offered (None: all).")
    disabled_toolsets: list[str] | None = Field(default=None, description="Toolsets removed from the enabled ones.")
    distribution: str | None = Field(
        default=None, description="Draw toolsets per group from this distribution instead."
    )
    system_prompt: str | None = Field(default=None, description="Replaces the env's system prompt.")
    eval_items: int = Field(default=8, description="Items `evaluate` runs, one rollout each.")
    eval_temperature: float = Field(default=0.0, description="Sampling temperature during evaluate.")
    temporal_address: str | None = Field(
        default=None, description="Temporal frontend; the rollouts settings' when unset."
    )
    run_name: str | None = Field(default=None, description="The training run (its workflow id); wandb_name when unset.")
    max_staleness: int = Field(
        default=field_default(FeedInput, "max_staleness"),
        description="Trainer steps a posted token may lag (the feed's admission).",
    )
    stale_groups: StaleGroups = Field(
        default=field_default(FeedInput, "stale_groups"), description="post, scores_only or drop a staler group."
    )
    max_retries: int = Field(
        default=field_default(FeedInput, "max_retries"),
        description="Runs a rollout gets after a machinery failure before its group is given up.",
    )
    groups_in_flight: int = Field(
        default=field_default(FeedInput, "max_groups_in_flight"), description="Groups whose rollouts run at once."
    )


class TemporalRolloutsEnv(BaseEnv):
    name = "temporal_rollouts"
    env_config_cls = TemporalRolloutsEnvConfig

    def __init__(
        self, config: TemporalRolloutsEnvConfig, server_configs: Any, slurm: bool = False, testing: bool = False
    ) -> None:
        if config.tokenizer_name == POLICY_TOKENIZER:  # atroposlib loads it now: the policy's, never a hub's
            config = config.model_copy(update={"tokenizer_name": policy_tokenizer(Settings(), config.policy)})
        super().__init__(config, server_configs, slurm=slurm, testing=testing)

    @classmethod
    def config_init(cls) -> tuple[TemporalRolloutsEnvConfig, list[APIServerConfig]]:
        config = TemporalRolloutsEnvConfig(
            wandb_name=cls.name, max_token_length=8192, worker_timeout=-1, tokenizer_name=POLICY_TOKENIZER
        )
        return config, [
            APIServerConfig(model_name="unused", base_url=UNUSED_SERVER, api_key="unused", health_check=False)
        ]

    async def setup(self) -> None:
        settings = Settings()
        if self.config.temporal_address:
            settings.temporal.address = self.config.temporal_address
        self.settings = settings
        self.client: Client = await connect(settings, objects=object_client(settings), start_embedded=False)
        for problem in load_env_sources(settings.env_modules):  # the envs the workers load, from the same settings
            log.warning("%s", problem.line())
        self.task_env = get_env(self.config.task_env, self.config.env_config)
        self.next_item = 0
        self.tool_error_buffer: list[dict[str, Any]] = []
        self.rng = random.Random()
        self._sampled: str | None = None

    async def get_next_item(self) -> Item:
        item = as_loaded(self.task_env, self.task_env.load_items(1, offset=self.next_item))[0]
        self.next_item += 1
        return item

    # ------------------------------------------------------------------ serve and process: a training feed

    async def env_manager(self) -> None:
        """`serve`: start (or attach to) the training run, watch it, stop it after `total_steps` trainer steps."""
        await self.setup()
        self._needs_tokens("serve")
        await self.setup_wandb()
        handle = await self._feed(
            FeedInput(**self._feed_fields(), sink="atropos", api_url=self.config.rollout_server_url)
        )
        stop_sent = False
        while True:
            status = await _status(handle)
            log.info("training run %s: %s", handle.id, _summary(status))
            if self.config.use_wandb:
                await self._sample_for_wandb(handle.id)
                await self.wandb_log(_figures(status))
            if status.phase == "done":
                return
            if not stop_sent and status.trainer.current_step >= self.config.total_steps > 0:
                log.info("the trainer took %d steps (total_steps): draining %s", status.trainer.current_step, handle.id)
                await handle.signal("stop")
                stop_sent = True
            await asyncio.sleep(WATCH_EVERY_S)

    async def process_manager(self) -> None:
        """`process`: a feed that writes `total_steps` groups to JSONL, copied to `data_path_to_save_groups`."""
        from atroposlib.frontend.jsonl2html import generate_html

        await self.setup()
        self._needs_tokens("process")
        run = self._run_name()
        target = self.config.data_path_to_save_groups
        if self.jsonl_writer is not None:  # atroposlib opened it; the feed's own file is copied here instead
            self.jsonl_writer.close()
            self.jsonl_writer = None
        handle = await self._feed(
            FeedInput(**self._feed_fields(), sink="jsonl", output=f"{run}.jsonl", max_groups=self.n_groups_to_process)
        )
        while (status := await _status(handle)).phase != "done":
            log.info("process %s: %s", run, _summary(status))
            await asyncio.sleep(WATCH_EVERY_S / 5)
        log.info("process %s finished: %s", run, _summary(status))
        if target and status.output and Path(status.output).exists():
            shutil.copyfile(status.output, target)
            generate_html(target)
        elif target:
            log.warning("the groups are in %s on the worker that wrote them, not here", status.output)

    async def _sample_for_wandb(self, run: str) -> None:
        """The group run-api received last, when it is this run's and new: a sample for the rollout table
        (the run posts its groups itself, so this process sees them only there)."""
        try:
            async with TrajectoryApi(self.config.rollout_server_url) as api:
                latest = await api.latest_group()
        except RolloutError:
            return
        group_id = (latest.get("group_overrides") or {}).get("group_id", "")
        if group_id.startswith(f"{run}/") and group_id != self._sampled:
            self._sampled = group_id
            await self.add_rollouts_for_wandb(latest)

    def _needs_tokens(self, mode: str) -> None:
        endpoint = self.settings.policy_endpoint(self.config.policy)
        if isinstance(endpoint, ChatPolicy) and not endpoint.tokenizer and not self._run_tokenizer():
            name = self.config.policy or self.settings.default_policy
            raise SystemExit(
                f"error: {mode} needs token ids, and policy {name!r} gives none: use a token-level "
                f"policy (type sglang or vllm), or give it a tokenizer (policies.{name}.tokenizer) for "
                "template-rendered tokens and masks"
            )

    def _run_tokenizer(self) -> str | None:
        """`--env.tokenizer_name`, for a chat policy that names no tokenizer: its template renders the tokens
        (the policy's own tokenizer wins where it has one; the default, `policy`, names none)."""
        name = self.config.tokenizer_name
        return name if name and name != POLICY_TOKENIZER else None

    def _run_name(self) -> str:
        return self.config.run_name or self.config.wandb_name or self.name

    def _feed_fields(self) -> dict[str, Any]:
        config = self.config
        env_config = dict(config.env_config)
        if config.system_prompt:
            env_config["system_prompt"] = config.system_prompt
        return {
            "env": config.task_env,
            "env_config": env_config,
            "policy": config.policy,
            "tokenizer": self._run_tokenizer(),
            "tool_call_parser": config.tool_call_parser,
            "group_size": config.group_size,
            "limits": RolloutLimits(
                max_turns=config.max_agent_turns,
                max_tool_calls=config.max_tool_calls,
                context_tokens=config.max_token_length,
            ),
            "sampling": Sampling(temperature=config.agent_temperature, max_tokens=config.agent_max_tokens),
            "max_staleness": config.max_staleness,
            "stale_groups": config.stale_groups,
            "max_retries": config.max_retries,
            "max_groups_in_flight": config.groups_in_flight,
            "env_weight": max(config.inference_weight, 1e-6),
        }

    async def _feed(self, feed: FeedInput) -> WorkflowHandle:
        """The run `run_name`: attached to when it runs (this process restarted), started otherwise."""
        from temporal_rollouts.client.training import start_feed

        run = self._run_name()
        handle = self.client.get_workflow_handle(run)
        try:
            described = await handle.describe()
            if (
                described.workflow_type == "TrainingFeedWorkflow"
                and described.status is not None
                and described.status.name == "RUNNING"
            ):
                log.info("attached to the running training run %s", run)
                return handle
        except RPCError:
            pass
        try:
            started = await start_feed(self.client, self.settings, run, feed)
        except ConfigError as err:
            raise SystemExit(f"error: {err.message}") from None
        log.info("started the training run %s", run)
        return started

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        started = time.time()
        items = as_loaded(self.task_env, self.task_env.load_items(self.config.eval_items))
        runs = await asyncio.gather(*(self._rollouts(i, 1, self.config.eval_temperature, "eval") for i in items))
        finished = [r[0] for r in runs if r]
        scores = [r.score for r in finished]
        metrics = {
            "eval/mean_score": sum(scores) / len(scores) if scores else 0.0,
            "eval/completed": len(finished),
            "eval/failed": len(items) - len(finished),
            "eval/mean_turns": sum(r.turns for r in finished) / len(finished) if finished else 0.0,
        }
        samples = [
            {
                "item_id": r.item_id,
                "rollout_id": r.rollout_id,
                "score": r.score,
                "turns": r.turns,
                "stop_reason": r.stop_reason.value,
            }
            for r in finished
        ]
        await self.evaluate_log(
            metrics,
            task_name=f"{self.config.task_env}_eval",
            start_time=started,
            end_time=time.time(),
            samples=samples,
            generation_parameters={"temperature": self.config.eval_temperature},
        )

    async def add_rollouts_for_wandb(self, scored_data: Any, item: Any = None) -> None:
        """The rollout table shows conversations (integrations/atropos/wandb_rollouts.py), not decoded tokens."""
        groups = scored_data if isinstance(scored_data, list) else [scored_data]
        for group in groups:
            self.rollouts_for_wandb.append(rollouts_for_table(group, self.config.num_rollouts_per_group_for_logging))
            if len(self.rollouts_for_wandb) > self.config.num_rollouts_to_keep:
                self.rollouts_for_wandb.pop(0)

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        """Tool errors as the system we replace logged them: a count and newline-joined
        details (wandb tables of them crashed on temp-file cleanup)."""
        wandb_metrics = dict(wandb_metrics or {})
        errors, self.tool_error_buffer = self.tool_error_buffer, []
        wandb_metrics["train/tool_errors_count"] = len(errors)
        if errors:
            wandb_metrics["train/tool_error_details"] = "\n".join(
                f"[turn {e['turn']}] {e['tool_name']}({e['arguments'][:200]}): {e['error'][:500]}" for e in errors
            )
        await super().wandb_log(wandb_metrics)

    # ------------------------------------------------------------------ rollouts as workflows

    def _trajectory_input(
        self, item: Item, temperature: float, group_index: int, tools: list[str] | None
    ) -> TrajectoryInput:
        env_config = dict(self.config.env_config)
        if tools is not None:
            env_config["tools"] = tools
        if self.config.system_prompt:
            env_config["system_prompt"] = self.config.system_prompt
        return TrajectoryInput(
            env=self.config.task_env,
            item=item,
            env_config=env_config,
            policy=self.config.policy,
            tool_call_parser=self.config.tool_call_parser,
            allow_network=self.task_env.allow_network,
            limits=RolloutLimits(
                max_turns=self.config.max_agent_turns,
                max_tool_calls=self.config.max_tool_calls,
                context_tokens=self.config.max_token_length,
            ),
            sampling=Sampling(temperature=temperature, max_tokens=self.config.agent_max_tokens),
            group_index=group_index,
        )

    async def _rollouts(
        self, item: Item, count: int, temperature: float, purpose: str
    ) -> list[TrajectoryResult] | None:
        """Run `count` rollouts of `item`; None when any failed (the group cannot be scored).
        Cancelled by atroposlib (back-pressure, shutdown), the workflows are cancelled too."""
        config = self.config
        chooses_tools = any(
            v is not None for v in (config.enabled_toolsets, config.disabled_toolsets, config.distribution)
        )
        tools = (
            resolve_tools(config.enabled_toolsets, config.disabled_toolsets, config.distribution, self.rng)
            if chooses_tools
            else None
        )
        prefix = f"atropos-{purpose}-{item.id}-{uuid.uuid4().hex[:10]}"
        handles: list[WorkflowHandle] = []
        try:
            for index in range(count):
                handles.append(
                    await self.client.start_workflow(
                        "TrajectoryWorkflow",
                        self._trajectory_input(item, temperature, index, tools),
                        id=f"{prefix}/{index}",
                        task_queue=self.settings.temporal.task_queue,
                        result_type=TrajectoryResult,
                        search_attributes=TypedSearchAttributes(
                            [
                                SearchAttributePair(sa.ENV, self.config.task_env),
                                SearchAttributePair(sa.ITEM_ID, item.id),
                                SearchAttributePair(sa.BATCH_ID, f"atropos-{self.config.wandb_name}"),
                            ]
                        ),
                    )
                )
            outcomes = await asyncio.gather(*(h.result() for h in handles), return_exceptions=True)
        except asyncio.CancelledError:
            await asyncio.gather(*(h.cancel() for h in handles), return_exceptions=True)
            raise
        results: list[TrajectoryResult] = []
        for handle, outcome in zip(handles, outcomes):
            if isinstance(outcome, TrajectoryResult):
                results.append(outcome)
                continue
            failed = failed_rollout_result(outcome.cause) if isinstance(outcome, WorkflowFailureError) else None
            why = f"{failed.stop_reason.value}: {failed.stop_detail}" if failed else repr(outcome)
            log.warning("rollout %s failed (%s); `rollouts resume %s` continues it", handle.id, why, handle.id)
        return results if len(results) == count else None


def policy_tokenizer(settings: Settings, policy: str | None) -> str:
    """The tokenizer a policy names; without one, atroposlib would fetch its default from a model hub."""
    endpoint = settings.policy_endpoint(policy)
    if endpoint.tokenizer:
        return endpoint.tokenizer
    name = policy or settings.default_policy
    raise SystemExit(
        f"error: policy {name!r} names no tokenizer: give it one (policies.{name}.tokenizer, a local "
        "folder) or pass --env.tokenizer_name"
    )


async def _status(handle: WorkflowHandle) -> FeedStatus:
    try:
        return FeedStatus.model_validate(await handle.query("status"))
    except WorkflowFailureError as err:
        raise SystemExit(f"error: the training run {handle.id} failed: {err.cause or err}") from None


def _summary(status: FeedStatus) -> str:
    f = status.figures
    return (
        f"{status.phase}; groups {f.groups_started} started, {status.in_flight} in flight, {f.groups_posted} "
        f"posted, dropped {f.dropped or 0}; rollouts {f.rollouts_retried} resumed; trainer step "
        f"{status.trainer.current_step}"
    )


def _figures(status: FeedStatus) -> dict[str, float]:
    """The run's figures as wandb metrics (`feed/...`)."""
    f = status.figures
    metrics = {
        "feed/in_flight": status.in_flight,
        "feed/groups_posted": f.groups_posted,
        "feed/groups_stale": f.groups_stale,
        "feed/groups_dropped": sum(f.dropped.values()),
        "feed/rollouts_retried": f.rollouts_retried,
        "feed/tokens_posted": f.tokens_posted,
        "feed/tokens_generated": f.tokens_generated,
        "feed/trainer_step": status.trainer.current_step,
    }
    if f.staleness:
        metrics["feed/max_staleness_posted"] = max(int(k) for k in f.staleness)
    if status.door is not None:
        metrics.update(door_metrics(status.door.model_dump(mode="json")))
    return metrics


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    TemporalRolloutsEnv.cli()
