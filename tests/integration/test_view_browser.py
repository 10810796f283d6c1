"""`rollouts view` in a real headless browser: Debian's chromium driven by playwright (no
browser download), over the page served by uvicorn against a real batch on the dev server
(one rollout failed by a 400 from the demo policy, one with a tool error)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import uvicorn
from temporalio.client import Client

from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.storage.transcripts import TranscriptStore
from temporal_rollouts.view.app import create_app
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.servers.process import free_port
from tests.support.waiting import batch_id
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]

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
        BatchWorkflow.run, BatchInput(env="terminal_tasks", num_items=1, group_size=2, policy=f"{view_policy.url}/v1"),
        id=batch_id("view"), task_queue=settings.temporal.task_queue,
    )
    assert (result.completed, result.failed) == (1, 1), view_policy.stats()
    return result


@pytest.fixture
async def served(project_client: Client, transcripts: TranscriptStore) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(project_client, transcripts), host="127.0.0.1", port=port,
                                           log_level="warning"))
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


async def only_row_stopped(page, reason: str) -> None:
    """Wait until the rollout list shows one row, stopped for `reason`."""
    await page.wait_for_function(
        "reason => { const rows = document.querySelectorAll('#rollout-rows tr.row');"
        " return rows.length === 1 && rows[0].children[2].textContent === reason; }", arg=reason)


async def test_the_page_lists_filters_and_renders_a_trajectory(view_batch: BatchResult, served: str, tmp_path: Path) -> None:
    async with playwright_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1600, "height": 1000})
        await page.goto(served)
        batch_row = page.locator(f"tr[data-batch='{view_batch.batch_id}']")
        await batch_row.wait_for()
        assert "completed" in await batch_row.inner_text()
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
        assert (await page.inner_text("#stop-reason")).startswith("completed")
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
