"""The interactive notebooks opened in JupyterLab in a real (headless) Chromium: every cell runs without an
error, widgets render as controls, and moving a control redraws the figure (issue 13)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from browser.jupyterlab_session import CHROMIUM, CHROMIUM_ARGS, jupyterlab, set_parameters, why_not_available

REPO = Path(__file__).resolve().parents[2]
REASON = why_not_available()
pytestmark = [pytest.mark.browser, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def _run_all(page, timeout_s: float = 240) -> None:
    """Run > Run All Cells, until every code cell has an execution count.

    JupyterLab can report its kernel idle a moment before the session takes requests; a run-all in that
    moment leaves cells unexecuted with the kernel idle. Seen here in 1 of 4 runs: such a stall is retried.
    """
    import time

    page.locator(".jp-Notebook").wait_for(timeout=60_000)
    page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(timeout=60_000)
    deadline = time.time() + timeout_s
    for _attempt in range(3):
        page.get_by_role("menuitem", name="Run").click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        idle_since = None
        while time.time() < deadline:
            prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
            if prompts and all(any(ch.isdigit() for ch in text) for text in prompts):
                return
            busy = any("*" in text for text in prompts)
            if busy:
                idle_since = None
            elif idle_since is None:
                idle_since = time.time()
            elif time.time() - idle_since > 10:
                break  # nothing running and cells left unexecuted: run all again
            time.sleep(0.5)
    raise AssertionError("Run All Cells did not execute every cell")


def _problems(page) -> list[str]:
    text = page.locator(".jp-Notebook").inner_text()
    return [marker for marker in ("Traceback", "Error displaying widget", "interactive(children=")
            if marker in text]


def _wait_for_redraw(page, before: str | None) -> None:
    """Until the widget's picture is a new one, or an error stands in its place (then _problems reports it)."""
    page.wait_for_function("(before) => { const imgs = document.querySelectorAll("
                           "'.jupyter-widgets-output-area img, .widget-output img');"
                           " return (imgs.length && imgs[imgs.length - 1].src !== before)"
                           " || document.body.innerText.includes('Traceback'); }",
                           arg=before, timeout=30_000)
    assert _problems(page) == []


def _widget_area(page, name: str, tmp_path: Path):
    """The output holding the notebook's widgets, after running every cell without errors (screenshot saved)."""
    _run_all(page)
    assert _problems(page) == []
    slider = page.locator(".widget-slider, .jupyter-widgets.widget-hslider").first
    slider.wait_for(timeout=30_000)
    area = page.locator(".jp-OutputArea-output").filter(has=slider).first
    area.scroll_into_view_if_needed()
    area.screenshot(path=str(tmp_path / f"{name}-widget-before.png"))
    return area, slider


@pytest.fixture
def browser_page(tmp_path: Path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        yield page
        browser.close()


def test_01_runs_and_its_index_slider_redraws_the_problem(tmp_path: Path, browser_page) -> None:
    notebook = tmp_path / "01.ipynb"
    shutil.copy(REPO / "notebooks" / "01_explore_dataset.ipynb", notebook)
    set_parameters(notebook, {"sample_root": str(tmp_path / "sample"), "sample_per_config": 10, "image_size": 80})
    page = browser_page
    with jupyterlab(tmp_path) as (url, token):
        try:
            page.goto(f"{url}/lab/tree/01.ipynb?token={token}")
            area, slider = _widget_area(page, "01", tmp_path)
            before = area.locator("img").last.get_attribute("src")
            slider.locator(".noUi-handle, .ui-slider-handle, [role=slider]").first.focus()
            page.keyboard.press("ArrowRight")
            _wait_for_redraw(page, before)
            area = page.locator(".jp-OutputArea-output").filter(has=slider).first
            area.screenshot(path=str(tmp_path / "01-widget-after.png"))
            # The figure is the problem the readout names: index 1 of Center's train split is RAVEN_1_train.
            readout = slider.locator(".widget-readout").inner_text().strip()
            assert readout == "1" and "center_single/RAVEN_1_train (index 1 of 6 train problems)" in area.inner_text()
            assert _problems(page) == []
        finally:
            page.screenshot(path=str(tmp_path / "01-final.png"), full_page=True)


def test_02_runs_and_its_transform_dropdown_redraws_the_augmentation(tmp_path: Path, browser_page) -> None:
    notebook = tmp_path / "02.ipynb"
    shutil.copy(REPO / "notebooks" / "02_augmentations.ipynb", notebook)
    set_parameters(notebook, {"sample_root": str(tmp_path / "sample"), "sample_per_config": 10, "image_size": 80,
                              "num_random": 2})
    page = browser_page
    with jupyterlab(tmp_path) as (url, token):
        try:
            page.goto(f"{url}/lab/tree/02.ipynb?token={token}")
            area, _slider = _widget_area(page, "02", tmp_path)
            assert "rotate, seed 0: " in area.inner_text()
            # Another transform from the dropdown: the caption names it, and the figure is redrawn.
            before = area.locator("img").last.get_attribute("src")
            area.locator("select").first.select_option("hflip")
            _wait_for_redraw(page, before)
            area.screenshot(path=str(tmp_path / "02-widget-hflip.png"))
            assert "hflip, seed 0: hflip" in area.inner_text()
        finally:
            page.screenshot(path=str(tmp_path / "02-final.png"), full_page=True)
