"""`rollouts view` in a real headless browser: Debian's chromium driven by playwright (no
browser download), over the page served by uvicorn against real batches on the dev server
(one with a rollout failed by a 400 from the demo policy and one with a tool error; one whose
every rollout failed; one watched while it runs) and real training runs (TrainingFeedWorkflow
writing groups to JSONL, or serving them at the trainer door to the test as its trainer; the demo
policy with SmolLM2's tokenizer exported from its GGUF)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import struct
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import uvicorn
from temporalio.client import Client

from temporal_rollouts.client.door import DoorRefused, RunDoors
from temporal_rollouts.client.forks import start_fork
from temporal_rollouts.client.rollout_rows import RolloutOutcome, RolloutRow
from temporal_rollouts.core.door import AckRequest, ReleaseRequest, TakeRequest
from temporal_rollouts.core.feed import FeedInput, FeedStatus
from temporal_rollouts.core.records import BatchInput, BatchResult, RolloutLimits
from temporal_rollouts.core.settings import ChatPolicy, Settings
from temporal_rollouts.core.trees import RolloutTreeResult
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.storage.feed_groups import FeedGroupStore
from temporal_rollouts.storage.objects import object_client
from temporal_rollouts.storage.transcripts import TranscriptStore
from temporal_rollouts.view.app import create_app
from temporal_rollouts.view.figures import Counts, batch_figures
from tests.support import TEMPLATES
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.servers.process import free_port
from tests.support.waiting import batch_id
from workflows.batch import BatchWorkflow
from workflows.feed import TrainingFeedWorkflow

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if not os.path.exists(CHROMIUM) or shutil.which("chromium") is None:
    pytest.skip("chromium is not installed (apt-get install -y chromium)", allow_module_level=True)
playwright_api = pytest.importorskip("playwright.async_api")


@pytest.fixture(scope="module")
def view_policy(tmp_path_factory) -> Iterator[DemoPolicyProcess]:
    """A demo policy of this module's own: a request left over from an earlier test would take its
    one-shot faults from the session's shared one (it did once in CI, and both rollouts completed)."""
    server = DemoPolicyProcess(tmp_path_factory.mktemp("view-policy") / "demo_policy.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
async def view_batch(
    project_client: Client, worker: None, settings: Settings, view_policy: DemoPolicyProcess
) -> BatchResult:
    view_policy.control(fail_next=1, fail_status=400, unknown_tool_next=1)
    result = await project_client.execute_workflow(
        BatchWorkflow.run,
        BatchInput(env="terminal_tasks", num_items=1, group_size=2, policy=f"{view_policy.url}/v1"),
        id=batch_id("view"),
        task_queue=settings.temporal.task_queue,
    )
    assert (result.completed, result.failed) == (1, 1), view_policy.stats()
    return result


@pytest.fixture(scope="module")
async def failed_batch(
    project_client: Client, worker: None, settings: Settings, view_policy: DemoPolicyProcess
) -> BatchResult:
    """A batch whose only rollout failed: the model rejected its first request."""
    view_policy.reset()
    view_policy.control(fail_next=1, fail_status=400)
    result = await project_client.execute_workflow(
        BatchWorkflow.run,
        BatchInput(env="echo_chain", num_items=1, group_size=1, policy=f"{view_policy.url}/v1"),
        id=batch_id("view-failed"),
        task_queue=settings.temporal.task_queue,
    )
    view_policy.reset()
    assert (result.completed, result.failed) == (0, 1)
    return result


@pytest.fixture(scope="module")
async def branched_batch(
    project_client: Client, worker: None, settings: Settings, view_policy: DemoPolicyProcess
) -> BatchResult:
    """One echo_chain rollout branched live after turn 1 into two: a root and its branch."""
    view_policy.reset()
    result = await project_client.execute_workflow(
        BatchWorkflow.run,
        BatchInput(
            env="echo_chain",
            env_config={"steps": 2},
            num_items=1,
            group_size=1,
            branch={"at_turns": [1], "factor": 2},
            policy=f"{view_policy.url}/v1",
        ),
        id=batch_id("view-branched"),
        task_queue=settings.temporal.task_queue,
    )
    assert (result.completed, result.failed) == (2, 0), result
    return result


@pytest.fixture(scope="module")
async def forked_batch(
    project_client: Client, settings: Settings, branched_batch: BatchResult
) -> tuple[BatchResult, str]:
    """The branched batch, and a fork of its root made afterwards (`rollouts fork`): a rollout of no batch,
    listed among the batch's rollouts right after its source."""
    root = f"{branched_batch.batch_id}/item-0/g0"
    handle, _, (fork,) = await start_fork(project_client, settings, root, 1, 1)
    (result,) = RolloutTreeResult.model_validate(await handle.result()).results
    assert result.score == 1.0, result.stop_detail
    return branched_batch, fork


@contextlib.asynccontextmanager
async def sft_policy(settings: Settings, view_policy: DemoPolicyProcess, tokenizer: Path) -> AsyncIterator[str]:
    """The demo policy as `view-sft`, with SmolLM2's tokenizer (exported from the GGUF once per test process,
    no model loaded) to render a training run's tokens."""
    settings.policies["view-sft"] = ChatPolicy(
        base_url=f"{view_policy.url}/v1",
        model="demo-policy",
        tokenizer=str(tokenizer),
        chat_template=str(TEMPLATES / "qwen2_5.jinja"),
    )
    try:
        yield "view-sft"
    finally:
        settings.policies.pop("view-sft", None)


def two_groups(policy: str, **fields) -> FeedInput:
    """A training run of two echo_chain groups of two, one turn each."""
    return FeedInput(
        env="echo_chain",
        env_config={"steps": 1},
        policy=policy,
        group_size=2,
        max_groups=2,
        limits=RolloutLimits(max_turns=3),
        **fields,
    )


@pytest.fixture(scope="module")
async def training_run(
    project_client: Client,
    worker: None,
    settings: Settings,
    view_policy: DemoPolicyProcess,
    smollm2_tokenizer_dir: Path,
) -> AsyncIterator[FeedStatus]:
    """A training run of two echo_chain groups written to JSONL."""
    async with sft_policy(settings, view_policy, smollm2_tokenizer_dir) as policy:
        feed = two_groups(policy, sink="jsonl")
        ended = await project_client.execute_workflow(
            TrainingFeedWorkflow.run, feed, id=batch_id("view-run"), task_queue=settings.temporal.task_queue
        )
        yield FeedStatus.model_validate(ended)


@pytest.fixture(scope="module")
async def door_run(
    project_client: Client,
    worker: None,
    settings: Settings,
    view_policy: DemoPolicyProcess,
    smollm2_tokenizer_dir: Path,
) -> AsyncIterator[FeedStatus]:
    """A training run of two echo_chain groups served at the trainer door, one group a batch: the test, as
    the trainer, takes batch 0, gives it back, takes it again and acknowledges it, then takes and
    acknowledges batch 1 (three takes, two acknowledged, one re-delivered)."""
    doors = RunDoors(project_client, FeedGroupStore(object_client(settings), settings.storage.bucket))

    async def take(run: str) -> dict:
        while True:
            with contextlib.suppress(DoorRefused):  # 503 while the run starts
                if (batch := (await doors.take(run, TakeRequest(consumer="view-test")))["batch"]) is not None:
                    return batch
            await asyncio.sleep(0.2)

    async with sft_policy(settings, view_policy, smollm2_tokenizer_dir) as policy:
        feed = two_groups(policy, sink="door", batch_size=2)
        run = batch_id("view-door")
        handle = await project_client.start_workflow(
            TrainingFeedWorkflow.run, feed, id=run, task_queue=settings.temporal.task_queue
        )
        first = await take(run)
        await doors.release(run, ReleaseRequest(number=first["number"], lease=first["lease"]))
        again = await take(run)
        assert (again["number"], again["deliveries"]) == (first["number"], 2)
        await doors.acknowledge(run, AckRequest(number=again["number"], lease=again["lease"]))
        second = await take(run)
        await doors.acknowledge(run, AckRequest(number=second["number"], lease=second["lease"]))
        yield FeedStatus.model_validate(await handle.result())


@pytest.fixture
async def served(project_client: Client, transcripts: TranscriptStore, pool: SandboxPool) -> AsyncIterator[str]:
    port = free_port()
    app = create_app(project_client, transcripts, sandboxes=pool.describe)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), task
        await asyncio.sleep(0.05)
    yield f"http://127.0.0.1:{port}/"
    server.should_exit = True
    await task


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


async def open_page(playwright, url: str, width: int = 1600, height: int = 1000):
    browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    page = await browser.new_page(viewport={"width": width, "height": height})
    await page.goto(url)
    return browser, page


async def row_count(page, count: int) -> None:
    await page.wait_for_function(f"document.querySelectorAll('#rollout-rows tr.row').length === {count}")


def shown_image(name: str | None) -> str:
    """How the page names a container's image: its last path part, the content id cut to 12 digits."""
    return "(own root)" if name is None else re.sub(r":([0-9a-f]{12})[0-9a-f]*$", r":\1", name.split("/")[-1])


async def only_row_stopped(page, reason: str) -> None:
    """Wait until the rollout list shows one row, stopped for `reason`."""
    await page.wait_for_function(
        "reason => { const rows = document.querySelectorAll('#rollout-rows tr.row');"
        " return rows.length === 1 && rows[0].children[2].textContent === reason; }",
        arg=reason,
    )


async def test_the_page_lists_filters_and_renders_a_trajectory(
    view_batch: BatchResult, served: str, tmp_path: Path, pool: SandboxPool
) -> None:
    async with playwright_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1600, "height": 1000})
        await page.goto(served)
        batch_row = page.locator(f"tr[data-batch='{view_batch.batch_id}']")
        await batch_row.wait_for()
        assert "partial" in await batch_row.inner_text()  # one rollout scored, one failed
        await batch_row.click()

        rollouts = page.locator("#rollout-rows tr.row")
        await page.wait_for_function("document.querySelectorAll('#rollout-rows tr.row').length === 2")
        await page.select_option("#status-filter", "failed")
        await only_row_stopped(page, "model_rejected")
        await page.select_option("#status-filter", "")
        await page.select_option("#reason-filter", "completed")
        await only_row_stopped(page, "completed")  # not the failed row the previous filter left
        await rollouts.first.click()

        await page.locator("#messages .msg.tool").first.wait_for()
        assert await page.inner_text("#image") == "(the sandbox server's own root)"
        assert (await page.inner_text("#stop-reason")).startswith("completed")
        # Each container with its image: the session's pool also holds the item-image containers that
        # earlier modules of this worker left idle, so the rows are checked against what the pool says.
        images = {c.container_id: c.image for c in await pool.describe()}
        sandboxes = [row.split("\t") for row in await page.locator("#sandbox-rows tr").all_inner_texts()]
        assert any(image == "(own root)" for _, image, *_ in sandboxes), sandboxes  # where the batch ran
        for container, image, *_ in sandboxes:
            if container in images:  # not one stopped since the page asked
                assert image == shown_image(images[container]), (container, image, images[container])
        assert await page.inner_text("#score") == "1"
        assert json.loads(await page.inner_text("#verifier"))  # the verifier's details, as it returned them
        assert await page.locator(".tool-error").count() == 1  # the call of an unknown tool
        roles = await page.locator("#messages .msg .role").all_inner_texts()
        assert [r.lower() for r in roles[:2]] == ["system", "user"] and "assistant" in [r.lower() for r in roles]
        assert await page.locator("#messages .call").count() >= 1

        shot = tmp_path / "trajectory.png"
        await page.screenshot(path=str(shot), full_page=True)
        width, height = png_size(shot)
        assert width >= 1600 and height >= 600 and shot.stat().st_size > 20_000

        await page.select_option("#reason-filter", "model_rejected")
        await only_row_stopped(page, "model_rejected")
        await rollouts.first.click()
        await page.wait_for_function("document.querySelector('#stop-reason')?.textContent.startsWith('model_rejected')")
        assert "failed" in await page.inner_text("#summary")
        await browser.close()


async def test_a_slow_answer_to_an_older_filter_does_not_replace_the_newer_one(
    view_batch: BatchResult, served: str
) -> None:
    """The unfiltered list is answered 1 s late, after the list for the filter chosen next:
    the page keeps showing what the newest filter asked for."""
    async with playwright_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await browser.new_page()
        await page.goto(served)
        await page.locator(f"tr[data-batch='{view_batch.batch_id}']").click()
        await page.wait_for_function("document.querySelectorAll('#rollout-rows tr.row').length === 2")
        await page.select_option("#reason-filter", "completed")
        await only_row_stopped(page, "completed")

        slow: list[str] = []

        async def late_when_unfiltered(route) -> None:
            if "stop_reason=" not in route.request.url:
                slow.append(route.request.url)
                await asyncio.sleep(1.0)
            await route.continue_()

        await page.route("**/rollouts?*", late_when_unfiltered)
        async with page.expect_response(lambda r: "/rollouts?" in r.url and "stop_reason=" not in r.url) as late:
            await page.select_option("#reason-filter", "")  # asks for both rows; answered late
            await page.select_option("#reason-filter", "model_rejected")  # asks for the failed row; answered at once
            await only_row_stopped(page, "model_rejected")
        await late.value  # the late answer has reached the page, so the check below is not made too early
        await page.wait_for_timeout(500)  # time for the page's handler of that answer to run
        assert slow, "the unfiltered request was not the one delayed"
        rows = await page.locator("#rollout-rows tr.row").all_inner_texts()
        assert len(rows) == 1 and "model_rejected" in rows[0], rows
        await browser.close()


async def test_a_batch_whose_every_rollout_failed_reads_failed_in_red(
    view_batch: BatchResult, failed_batch: BatchResult, served: str
) -> None:
    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served)
        failed = page.locator(f"tr[data-batch='{failed_batch.batch_id}'] td.status")
        partial = page.locator(f"tr[data-batch='{view_batch.batch_id}'] td.status")
        await failed.wait_for()
        assert await failed.inner_text() == "failed"
        assert await failed.evaluate("cell => getComputedStyle(cell).color") == "rgb(180, 35, 24)"
        assert await partial.inner_text() == "partial"
        assert (
            await partial.evaluate("cell => getComputedStyle(cell).color") != "rgb(23, 128, 61)"
        )  # not the green of success
        await browser.close()


async def test_the_batch_panel_shows_every_column_at_1600_pixels(view_batch: BatchResult, served: str) -> None:
    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served)
        await page.locator(f"tr[data-batch='{view_batch.batch_id}']").wait_for()
        panel = await page.locator("#batches").bounding_box()
        for column in ("failed", "score"):
            header = await page.locator("#batches th", has_text=column).bounding_box()
            assert header["x"] + header["width"] <= panel["x"] + panel["width"], column
        # Whatever other batches the server holds (long ids, large counts), no cell leaves the panel.
        right_edges = await page.eval_on_selector_all(
            "#batches td", "cells => cells.map((c) => c.getBoundingClientRect().right)"
        )
        assert right_edges and max(right_edges) <= panel["x"] + panel["width"], max(right_edges)
        await browser.close()


async def test_scores_filter_and_a_failed_rollout_is_not_scored(view_batch: BatchResult, served: str) -> None:
    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served)
        await page.locator(f"tr[data-batch='{view_batch.batch_id}']").click()
        await row_count(page, 2)
        failed_row = page.locator("#rollout-rows tr.row", has_text="model_rejected")
        assert await failed_row.locator("td").nth(3).inner_text() == "not scored"

        await page.fill("#min-score", "1")
        await only_row_stopped(page, "completed")
        await page.fill("#min-score", "")
        await page.fill("#max-score", "0.5")  # the failed rollout's 0 in its search attribute is no score
        await page.wait_for_function("document.querySelector('#rollout-rows').textContent === 'no rollouts match'")
        await page.click("#clear-filters")
        await row_count(page, 2)
        await page.locator("#chart-scores rect[data-label='1']").click()  # a bar of the score distribution
        await only_row_stopped(page, "completed")
        assert await page.input_value("#min-score") == "1" == await page.input_value("#max-score")

        await failed_row.wait_for(state="detached")
        await page.click("#clear-filters")
        await row_count(page, 2)
        await page.locator("#rollout-rows tr.row", has_text="model_rejected").click()
        await page.wait_for_function("document.querySelector('#score')?.textContent.startsWith('not scored')")
        await browser.close()


async def test_the_figures_chart_scores_stop_reasons_turns_and_time(
    view_batch: BatchResult, served: str, tmp_path: Path
) -> None:
    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served)
        await page.locator(f"tr[data-batch='{view_batch.batch_id}']").click()
        await page.locator("#chart-time [data-part='model']").wait_for()
        assert await page.locator("#chart-scores rect.bar").count() == 1  # one scored rollout, score 1
        stops = await page.locator("#chart-stops .hbar").evaluate_all("bars => bars.map(b => b.dataset.label)")
        assert sorted(stops) == ["completed", "model_rejected"]
        assert await page.locator("#chart-turns rect.bar").count() >= 1
        legend = await page.inner_text("#counts")
        assert "completed 1" in legend and "failed 1" in legend and "queued 0" in legend
        await page.screenshot(path=str(tmp_path / "figures.png"), full_page=True)
        await page.locator("#chart-stops .hbar[data-label='model_rejected']").click()
        await only_row_stopped(page, "model_rejected")
        await browser.close()


async def test_a_long_stop_reason_wraps_inside_its_panel(view_batch: BatchResult, served: str) -> None:
    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served, width=1100)
        await page.locator(f"tr[data-batch='{view_batch.batch_id}']").click()
        await row_count(page, 2)
        await page.locator("#rollout-rows tr.row", has_text="model_rejected").click()
        cell = page.locator("#stop-reason")
        await page.wait_for_function(
            "document.querySelector('#stop-reason')?.textContent.startsWith('model_rejected: ')"
        )
        assert await cell.evaluate("c => c.scrollWidth <= c.clientWidth")
        box, panel = await cell.bounding_box(), await page.locator("#trajectory").bounding_box()
        assert box["x"] + box["width"] <= panel["x"] + panel["width"]
        await browser.close()


async def test_choosing_another_batch_clears_the_trajectory(
    view_batch: BatchResult, failed_batch: BatchResult, served: str
) -> None:
    """Also when the trajectory's answer comes after the switch: it belongs to the batch left behind."""
    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served)
        await page.locator(f"tr[data-batch='{view_batch.batch_id}']").click()
        await row_count(page, 2)
        await page.locator("#rollout-rows tr.row").first.click()
        await page.locator("#messages .msg").first.wait_for()
        await page.locator(f"tr[data-batch='{failed_batch.batch_id}']").click()
        await page.wait_for_function("document.querySelector('#trajectory-body').textContent === 'choose a rollout'")
        await row_count(page, 1)

        async def late(route) -> None:
            await asyncio.sleep(1.0)
            await route.continue_()

        await page.route("**/api/rollouts/**", late)
        await page.locator("#rollout-rows tr.row").first.click()
        await page.locator(f"tr[data-batch='{view_batch.batch_id}']").click()
        await page.wait_for_timeout(1500)
        assert await page.inner_text("#trajectory-body") == "choose a rollout"
        await browser.close()


async def test_a_running_batch_updates_on_the_page_without_a_reload(
    project_client: Client, worker: None, settings: Settings, view_policy: DemoPolicyProcess, served: str
) -> None:
    """Eleven slow rollouts, three at a time: the page, left alone, follows the counts as they
    change, ends on the finished batch, and lists its rollouts item-0, item-1, ..., item-10."""
    view_policy.reset()
    view_policy.control(delay_s=0.4)
    handle = await project_client.start_workflow(
        BatchWorkflow.run,
        BatchInput(
            env="echo_chain",
            num_items=11,
            group_size=1,
            max_concurrency=3,
            env_config={"steps": 1},
            policy=f"{view_policy.url}/v1",
        ),
        id=batch_id("view-live"),
        task_queue=settings.temporal.task_queue,
    )
    try:
        async with playwright_api.async_playwright() as playwright:
            browser, page = await open_page(playwright, served + "?refresh_ms=700")
            navigations: list[str] = []
            page.on("framenavigated", lambda frame: navigations.append(frame.url))
            row = page.locator(f"tr[data-batch='{handle.id}']")
            await row.wait_for()
            assert await row.locator("td.status").inner_text() == "running"
            await row.click()
            seen_done: list[str] = []
            seen_counts: list[str] = []
            for _ in range(200):
                seen_done.append(await row.locator("td").nth(2).inner_text())
                if await page.locator("#counts").count():
                    seen_counts.append(await page.inner_text("#counts"))
                if await row.locator("td.status").inner_text() == "completed" and seen_done[-1] == "11":
                    break
                await page.wait_for_timeout(250)
            assert seen_done[-1] == "11", seen_done
            assert len(set(seen_done)) >= 3, seen_done  # it moved while we watched
            assert len(set(seen_counts)) >= 2, seen_counts  # and so did the figures
            assert navigations == [], "the page never reloaded"
            await page.wait_for_function("document.querySelector('#counts')?.textContent.includes('completed 11')")
            await row_count(page, 11)
            names = await page.locator("#rollout-rows tr.row td:first-child").all_inner_texts()
            assert names == [f"item-{i}/g0" for i in range(11)]
            await browser.close()
    finally:
        view_policy.reset()
        await handle.result()


async def test_a_training_run_is_listed_with_its_feed_figures(training_run: FeedStatus, served: str) -> None:
    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served)
        run = page.locator(f"tr[data-run='{training_run.run}']")
        await run.wait_for()
        assert await run.locator("td.status").inner_text() == "completed"
        await run.click()
        await page.locator("#feed-line").wait_for()
        posted = page.locator("#chart-groups .hbar[data-label='posted']")
        assert (await posted.inner_text()).split()[-1] == str(training_run.figures.groups_posted) == "2"
        await page.locator("#chart-staleness").wait_for()
        await row_count(page, 4)  # the run's rollouts: two groups of two
        assert await page.locator("#rollout-rows tr.row", has_text="completed").count() == 4
        assert "Figures of training run" in await page.inner_text("#figures-title")
        await browser.close()


async def test_a_door_run_shows_batches_taken_acknowledged_and_re_delivered(door_run: FeedStatus, served: str) -> None:
    assert door_run.door is not None
    d = door_run.door.figures
    assert (d.batches_taken, d.batches_acknowledged, d.batches_redelivered) == (3, 2, 1)
    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served)
        run = page.locator(f"tr[data-run='{door_run.run}']")
        await run.wait_for()
        await run.click()
        await page.locator("#chart-door").wait_for()
        bars = {
            label: (await page.locator(f"#chart-door .hbar[data-label='{label}']").inner_text()).split()[-1]
            for label in ("taken", "acknowledged", "re-delivered")
        }
        assert bars == {"taken": "3", "acknowledged": "2", "re-delivered": "1"}
        await page.locator("#chart-door-staleness").wait_for()
        await browser.close()


async def test_a_thousand_rollouts_render_at_once_and_the_two_zero_scores_are_one_click_away(served: str) -> None:
    """The page against a batch of 1,000 rollouts (its API answered here, as the server would answer):
    the list and the charts render within a second or two, and the score bar of 0 lists its two."""
    rows = [
        RolloutRow(
            rollout_id=f"big/item-{i}/g0",
            run_id=f"run-{i}",
            status="completed",
            stop_reason="completed",
            score=0.0 if i in (17, 803) else 1.0,
        )
        for i in range(1000)
    ]
    outcomes = {
        row.rollout_id: RolloutOutcome(
            turns=2 + i % 5,
            tool_calls=1,
            timings={"acquire": 0.1, "llm": 1.0, "tools": 0.2, "verify": 0.3, "total": 1.7},
        )
        for i, row in enumerate(rows)
    }
    figures = batch_figures("big", "batch", "completed", Counts(total=1000, completed=1000), rows, outcomes, 0)
    batch = {
        "batch_id": "big",
        "status": "completed",
        "outcome": "completed",
        "total": 1000,
        "completed": 1000,
        "failed": 0,
        "running": 0,
        "mean_score": 0.998,
    }
    asked: list[str] = []

    async def answer(route) -> None:
        url = route.request.url
        if url.endswith("/api/batches"):
            body = [batch]
        elif url.endswith("/api/runs"):
            body = []
        elif "/figures" in url:
            body = figures.model_dump(mode="json")
        else:
            asked.append(url)
            zeros = "max_score=0" in url
            body = [row.model_dump(mode="json") for row in rows if not zeros or row.score == 0.0]
        await route.fulfill(json=body)

    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served)
        await page.route("**/api/**", answer)
        await page.reload()
        started = time.monotonic()
        await page.locator("tr[data-batch='big']").click()
        await row_count(page, 1000)
        await page.locator("#chart-time [data-part='model']").wait_for()
        elapsed = time.monotonic() - started
        assert elapsed < 3.0, f"{elapsed:.1f} s to show 1,000 rollouts and their figures"
        assert await page.locator("#chart-scores rect.bar").count() == 2  # 0 and 1
        await page.locator("#chart-scores rect[data-label='0']").click()
        await row_count(page, 2)
        assert "min_score=0" in asked[-1] and "max_score=0" in asked[-1]
        await browser.close()


async def test_a_rollout_shows_where_it_branched_and_each_link_opens_the_other(
    branched_batch: BatchResult, served: str
) -> None:
    """The root lists its branch after turn 1; the branch says it was forked from the root; each id opens
    the other rollout."""
    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served)
        await page.locator(f"tr[data-batch='{branched_batch.batch_id}']").click()
        await row_count(page, 2)
        rows = page.locator("#rollout-rows tr.row")
        for index in range(2):  # the root is whichever row lists branches
            await rows.nth(index).click()
            await page.wait_for_selector("#summary")
            if await page.locator("#summary td.branches").count():
                break
        branches = page.locator("#summary td.branches")
        assert (await branches.inner_text()).startswith("after turn 1: ")
        root = await page.inner_text("#summary tr:first-child td:last-child")
        child = await branches.locator("a.tree-link").first.get_attribute("data-rollout")
        assert child and child != root
        await branches.locator("a.tree-link").first.click()
        await page.wait_for_function(
            "child => document.querySelector('#summary tr:first-child td:last-child')?.textContent === child", arg=child
        )
        forked = page.locator("#forked-from")
        assert f"{root} after turn 1" in await forked.inner_text()
        await forked.locator("a.tree-link").click()
        await page.wait_for_function(
            "root => document.querySelector('#summary tr:first-child td:last-child')?.textContent === root", arg=root
        )
        await browser.close()


LAYOUT_CHECK = """
() => {
  const box = (node) => node.getBoundingClientRect();
  const problems = [];
  if (document.documentElement.scrollWidth > window.innerWidth) problems.push(`the page scrolls sideways: ${document.documentElement.scrollWidth} > ${window.innerWidth}`);
  for (const table of document.querySelectorAll("#batches table, #runs table, #rollouts table")) {
    const heads = [...table.querySelectorAll("thead th")];
    heads.forEach((th, i) => {
      if (th.scrollWidth > th.clientWidth + 1) problems.push(`header "${th.textContent}" does not fit its column`);
      const next = heads[i + 1];
      if (next && box(th).right > box(next).left + 0.5) problems.push(`headers "${th.textContent}" and "${next.textContent}" overlap`);
    });
    const section = table.closest("section");
    if (box(table).right > box(section).right + 0.5) problems.push(`the table of #${section.id} is cut off on the right`);
    if (section.scrollWidth > section.clientWidth + 1) problems.push(`#${section.id} scrolls sideways`);
    if (box(section).right > window.innerWidth) problems.push(`#${section.id} leaves the screen`);
  }
  for (const cell of document.querySelectorAll("td.id")) {
    if (cell.scrollWidth > cell.clientWidth + 1) problems.push(`id ${cell.title} is cut`);
    const shown = [...cell.childNodes].filter((n) => n.nodeType === Node.TEXT_NODE).map((n) => n.textContent).join("");
    if (shown.length < 3 || !cell.title.endsWith(shown)) problems.push(`id ${cell.title} is shown as "${shown}"`);
  }
  return problems;
}
"""


@pytest.mark.parametrize("width", [1400, 800])
async def test_the_page_reads_at_1400_and_800_pixels_and_lists_forks_in_their_batch(
    view_batch: BatchResult, forked_batch: tuple[BatchResult, str], served: str, tmp_path: Path, width: int
) -> None:
    """Headers apart, ids whole (wrapped at their separators, never cut to a character; the full id on
    hover), no table cut off on the right, the page never wider than the screen; a fork made after the
    batch is listed right after its source, marked as a fork. Screenshots of both widths are kept."""
    branched, fork = forked_batch
    async with playwright_api.async_playwright() as playwright:
        browser, page = await open_page(playwright, served, width=width, height=900)
        batch_row = page.locator(f"tr[data-batch='{branched.batch_id}']")
        await batch_row.wait_for()
        id_cell = batch_row.locator("td.id")
        assert await id_cell.get_attribute("title") == branched.batch_id
        assert (await id_cell.inner_text()).replace("\n", "") == branched.batch_id  # whole, if wrapped
        assert (await id_cell.bounding_box())["width"] >= 120, "an id column of a few characters"
        await batch_row.click()
        await row_count(page, 3)
        ids = await page.locator("#rollout-rows tr.row").evaluate_all("rows => rows.map(r => r.dataset.rollout)")
        root = f"{branched.batch_id}/item-0/g0"
        assert ids == [root, fork, f"{root}/t1b1"], ids  # natural order: the fork right after its source
        fork_row = page.locator(f"#rollout-rows tr[data-rollout='{fork}']")
        assert "fork" in (await fork_row.get_attribute("class")).split()
        assert await fork_row.locator(".fork-note").inner_text() == "fork of item-0/g0 after turn 1"
        counts = await page.locator("#counts").inner_text()
        assert "completed 2" in counts, counts  # the fork is listed, never counted in the batch
        await fork_row.click()
        await page.wait_for_function("document.querySelector('#forked-from') !== null")

        problems = await page.evaluate(LAYOUT_CHECK)
        shot = tmp_path / f"view-{width}.png"
        await page.screenshot(path=str(shot), full_page=True)
        assert problems == [], problems
        assert png_size(shot)[0] == width
        rollouts_box = await page.locator("#rollouts").bounding_box()
        assert rollouts_box["x"] >= 0 and rollouts_box["x"] + rollouts_box["width"] <= width
        if width == 800:  # one column: the lists above the detail, every panel the screen's width less its margins
            assert rollouts_box["width"] >= width - 60, rollouts_box
        await browser.close()


async def test_a_batch_whose_every_turn_fails_shows_why_within_a_refresh(
    project_client: Client, worker: None, settings: Settings, served: str
) -> None:
    """Not just "running": the batch's row is marked, and its figures name the retried step, its error and
    its attempt, from Temporal's pending-activity information, at the next refresh."""
    closed = free_port()  # nothing listens there
    handle = await project_client.start_workflow(
        BatchWorkflow.run,
        BatchInput(env="echo_chain", num_items=1, group_size=1, policy=f"http://127.0.0.1:{closed}/v1"),
        id=batch_id("view-retrying"),
        task_queue=settings.temporal.task_queue,
    )
    try:
        async with playwright_api.async_playwright() as playwright:
            browser, page = await open_page(playwright, served + "?refresh_ms=700")
            row = page.locator(f"tr[data-batch='{handle.id}']")
            await row.locator(".warn").wait_for(timeout=20_000)
            assert "waiting on llm_turn: model unreachable" in await row.locator(".warn").get_attribute("title")
            await row.click()
            notes = page.locator("#retrying")
            await notes.wait_for(timeout=20_000)
            assert (
                "1 rollout waiting on llm_turn: model unreachable: connection refused, retry"
                in await notes.inner_text()
            )
            await browser.close()
    finally:
        await handle.result()
