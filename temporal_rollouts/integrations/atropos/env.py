"""An atroposlib `BaseEnv` whose rollouts are our durable Temporal workflows.

    python -m temporal_rollouts.integrations.atropos.env serve    --env.task_env terminal_tasks --env.policy smol ...
    python -m temporal_rollouts.integrations.atropos.env process  --env.data_path_to_save_groups out/groups.jsonl ...
    python -m temporal_rollouts.integrations.atropos.env evaluate --env.data_dir_to_save_evals out/evals ...

Each group is `group_size` `TrajectoryWorkflow`s started on the `rollouts` task queue,
so `python worker.py` processes (anywhere) run them, a crashed worker costs one step,
and the env process itself holds nothing but references. The finished group is read
back from payload storage (transcripts, token traces) into a `ScoredDataGroup`, and
atroposlib does the rest: `serve` posts it to `run-api`, `process` writes JSONL and
HTML, `evaluate` writes metrics.

The policy is named, not described: the workers resolve it from their own settings,
so endpoints and keys never pass through Atropos flags or workflow histories. Training
needs a token-level policy (`type = "sglang"` or `"vllm"`): a group whose rollouts
carry no token trace is dropped with that reason.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from typing import Any

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig
from pydantic import Field
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from envs import get_env
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.records import (
    RolloutLimits,
    Sampling,
    TrajectoryInput,
    TrajectoryResult,
    failed_rollout_result,
)
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.integrations.atropos.wandb_rollouts import rollouts_for_table
from temporal_rollouts.runtime.temporal import connect
from temporal_rollouts.sinks.groups import GroupBuilder
from temporal_rollouts.storage.objects import object_client
from temporal_rollouts.storage.token_traces import TokenTraceStore
from temporal_rollouts.storage.transcripts import TranscriptStore
from temporal_rollouts.tools.toolsets import resolve_tools

log = logging.getLogger("temporal_rollouts.atropos")

UNUSED_SERVER = "http://127.0.0.1:9/v1"
"""atroposlib insists on an inference server config; ours are the workers' policies, so this one is never called."""


class TemporalRolloutsEnvConfig(BaseEnvConfig):
    task_env: str = Field(default="terminal_tasks", description="Our env (task family) the items come from.")
    env_config: dict[str, Any] = Field(default_factory=dict, description="Config of that env.")
    policy: str | None = Field(default=None, description="Policy name in the workers' settings; their default when unset.")
    max_agent_turns: int = Field(default=30, description="Model turns before a rollout stops.")
    max_tool_calls: int = Field(default=100, description="Tool calls before a rollout stops.")
    agent_temperature: float = Field(default=1.0, description="Sampling temperature of every turn.")
    agent_max_tokens: int | None = Field(default=None, description="Per-turn generation cap; None leaves it to the context budget.")
    tool_call_parser: str | None = Field(default=None, description="Overrides the policy's tool-call parser (hermes, qwen3_coder, ...).")
    enabled_toolsets: list[str] | None = Field(default=None, description="Toolsets offered (None: all).")
    disabled_toolsets: list[str] | None = Field(default=None, description="Toolsets removed from the enabled ones.")
    distribution: str | None = Field(default=None, description="Draw toolsets per group from this distribution instead.")
    system_prompt: str | None = Field(default=None, description="Replaces the env's system prompt.")
    eval_items: int = Field(default=8, description="Items `evaluate` runs, one rollout each.")
    eval_temperature: float = Field(default=0.0, description="Sampling temperature during evaluate.")
    temporal_address: str | None = Field(default=None, description="Temporal frontend; the rollouts settings' when unset.")


class TemporalRolloutsEnv(BaseEnv):
    name = "temporal_rollouts"
    env_config_cls = TemporalRolloutsEnvConfig

    @classmethod
    def config_init(cls) -> tuple[TemporalRolloutsEnvConfig, list[APIServerConfig]]:
        config = TemporalRolloutsEnvConfig(wandb_name=cls.name, max_token_length=8192, worker_timeout=-1)
        return config, [APIServerConfig(model_name="unused", base_url=UNUSED_SERVER, api_key="unused", health_check=False)]

    async def setup(self) -> None:
        settings = Settings()
        if self.config.temporal_address:
            settings.temporal.address = self.config.temporal_address
        objects = object_client(settings)
        self.settings = settings
        self.client: Client = await connect(settings, objects=objects, start_embedded=False)
        self.groups = GroupBuilder(TranscriptStore(objects, settings.storage.bucket),
                                   TokenTraceStore(objects, settings.storage.bucket))
        self.task_env = get_env(self.config.task_env, self.config.env_config)
        self.next_item = 0
        self.tool_error_buffer: list[dict[str, Any]] = []
        self.rng = random.Random()

    async def get_next_item(self) -> Item:
        item = self.task_env.load_items(1, offset=self.next_item)[0]
        self.next_item += 1
        return item

    async def collect_trajectories(self, item: Item) -> tuple[dict[str, Any] | None, list]:
        results = await self._rollouts(item, self.config.group_size, self.config.agent_temperature, "train")
        if results is None:
            return None, []
        if any(r.tokens is None for r in results):
            log.error("group of %s dropped: policy %r gives no token ids (use an sglang or vllm policy to train)",
                      item.id, self.config.policy)
            return None, []
        limit = self.max_token_len if self.max_token_len > 0 else self.config.max_token_length
        # atroposlib drops a group holding a sequence of max_token_len tokens or more: cut below it
        group = await self.groups.build(f"{item.id}/{uuid.uuid4().hex[:8]}", results, max_token_length=limit - 1)
        self.tool_error_buffer.extend(group.metadata["tool_errors"]["errors"])
        return group.for_api(), []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        started = time.time()
        items = self.task_env.load_items(self.config.eval_items)
        runs = await asyncio.gather(*(self._rollouts(i, 1, self.config.eval_temperature, "eval") for i in items))
        finished = [r[0] for r in runs if r]
        scores = [r.score for r in finished]
        metrics = {
            "eval/mean_score": sum(scores) / len(scores) if scores else 0.0,
            "eval/completed": len(finished),
            "eval/failed": len(items) - len(finished),
            "eval/mean_turns": sum(r.turns for r in finished) / len(finished) if finished else 0.0,
        }
        samples = [{"item_id": r.item_id, "rollout_id": r.rollout_id, "score": r.score, "turns": r.turns,
                    "stop_reason": r.stop_reason.value} for r in finished]
        await self.evaluate_log(metrics, task_name=f"{self.config.task_env}_eval", start_time=started,
                                end_time=time.time(), samples=samples,
                                generation_parameters={"temperature": self.config.eval_temperature})

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

    def _trajectory_input(self, item: Item, temperature: float, group_index: int, tools: list[str] | None) -> TrajectoryInput:
        env_config = dict(self.config.env_config)
        if tools is not None:
            env_config["tools"] = tools
        if self.config.system_prompt:
            env_config["system_prompt"] = self.config.system_prompt
        return TrajectoryInput(
            env=self.config.task_env, item=item, env_config=env_config, policy=self.config.policy,
            tool_call_parser=self.config.tool_call_parser, allow_network=self.task_env.allow_network,
            limits=RolloutLimits(max_turns=self.config.max_agent_turns, max_tool_calls=self.config.max_tool_calls,
                                 context_tokens=self.config.max_token_length),
            sampling=Sampling(temperature=temperature, max_tokens=self.config.agent_max_tokens),
            group_index=group_index,
        )

    async def _rollouts(self, item: Item, count: int, temperature: float, purpose: str) -> list[TrajectoryResult] | None:
        """Run `count` rollouts of `item`; None when any failed (the group cannot be scored).
        Cancelled by atroposlib (back-pressure, shutdown), the workflows are cancelled too."""
        config = self.config
        chooses_tools = any(v is not None for v in (config.enabled_toolsets, config.disabled_toolsets, config.distribution))
        tools = resolve_tools(config.enabled_toolsets, config.disabled_toolsets, config.distribution, self.rng) \
            if chooses_tools else None
        prefix = f"atropos-{purpose}-{item.id}-{uuid.uuid4().hex[:10]}"
        handles: list[WorkflowHandle] = []
        try:
            for index in range(count):
                handles.append(await self.client.start_workflow(
                    "TrajectoryWorkflow", self._trajectory_input(item, temperature, index, tools),
                    id=f"{prefix}/{index}", task_queue=self.settings.temporal.task_queue,
                    result_type=TrajectoryResult,
                    search_attributes=TypedSearchAttributes([
                        SearchAttributePair(sa.ENV, self.config.task_env), SearchAttributePair(sa.ITEM_ID, item.id),
                        SearchAttributePair(sa.BATCH_ID, f"atropos-{self.config.wandb_name}"),
                    ]),
                ))
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


if __name__ == "__main__":
    TemporalRolloutsEnv.cli()
