"""The inspector page in headless Chromium: a short real run, `creditrl inspect`, then the DOM.

Needs the Debian packages ``chromium`` and ``chromium-driver`` (``.ci/install-browser``) and
the ``selenium`` package (the ``test`` extra); skips, saying so, only when they are missing.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import struct

import pytest

from creditrl.cli import main
from creditrl.config import load_config
from creditrl.inspect.report import build_report
from creditrl.train.rl import RLTrainer
from creditrl.train.sft import cached_sft

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install -e '.[test]'")
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip(
        "headless Chromium is not installed: run .ci/install-browser (apt-get install -y chromium chromium-driver)",
        allow_module_level=True,
    )
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

# Sums and differences of 1-2 operations: 150 SFT steps give a policy that is sometimes right.
RUN = [
    "task.args={min_ops: 1, max_ops: 2, operand_min: 1, operand_max: 5, operators: '+-', heldout_mod: 2}",
    "sft.task_args={min_ops: 1, max_ops: 2, operand_min: 1, operand_max: 5, operators: '+-', heldout_mod: 2}",
    "sft.steps=150",
    "sft.batch_size=16",
    "sft.warmup_steps=20",
    "sft.lr=0.005",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=24",
    "train.iterations=3",
    "train.eval_every=3",
    "train.checkpoint_every=3",
    "train.eval_size=8",
    "train.inspect_every=1",
    "train.inspect_groups=2",
    "train.progress=false",
]
TOKENS_JS = """return Array.from(document.querySelectorAll(arguments[0] + ' .tok')).map(
  t => [Number(t.getAttribute('data-adv')), getComputedStyle(t).backgroundColor, t.textContent]);"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("inspect")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDITRL_CACHE", str(root / "cache"))
        cfg = load_config(overrides=RUN)
        sft, _ = cached_sft(cfg, progress=False)
        RLTrainer.from_config(cfg, root / "run", init_path=str(sft)).run()
    assert main(["inspect", str(root / "run"), "--out", str(root / "report")]) == 0
    page = (root / "report" / "index.html").read_text()
    blob = re.search(r'<script type="application/json" id="inspector-data">(.*?)</script>', page, re.S).group(1)
    return {"dir": root / "report", "data": json.loads(blob), "run": root / "run"}


@pytest.fixture(scope="module")
def browser(report: dict):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    # the viewport itself 1280x800 (a window of that size has less room for the page)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False}
    )
    driver.get((report["dir"] / "index.html").as_uri())
    yield driver
    driver.quit()


def flat(rows: list[list[float]]) -> list[float]:
    return [a for row in rows for a in row]


def rgb(css: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", css)[:3])


def hand_precision(group: dict, adv: list[list[float]]) -> float | None:
    """Negative credit on wrong steps / on all labelled steps, pooled over the group's responses."""
    wrong = total = 0.0
    for r, a in zip(group["responses"], adv):
        for (s, e), ok in zip(r["steps"], r["labels"]):
            neg = sum(max(0.0, -x) for x in a[s : e + 1])
            total += neg
            wrong += 0.0 if ok else neg
    return wrong / total if total > 0 else None


def check_column(driver, selector: str, group: dict, adv: list[list[float]]) -> list[tuple]:
    toks = driver.execute_script(TOKENS_JS, selector)
    texts = [r["special"].get(str(i), x) for r in group["responses"] for i, x in enumerate(r["texts"])]
    assert [t[2] for t in toks] == texts
    assert [t[0] for t in toks] == pytest.approx(flat(adv), abs=1e-6)
    top = float(driver.find_element(By.ID, "legend-max").get_attribute("data-value")) or 1.0  # the scale's max
    for a, bg, _ in toks:  # diverging scale: red above 0, blue below, white at 0
        r, _, b = rgb(bg)
        if a == 0:
            assert rgb(bg) == (255, 255, 255)
        elif abs(a) / top > 0.02:
            assert (r > b) if a > 0 else (b > r), (a, bg)
    return toks


def test_report_files(report: dict) -> None:
    names = {p.name for p in report["dir"].iterdir()}
    assert {"index.html", "metrics.png", "credit_iter_000003_trained.png", "credit_iter_000003_grpo.png"} <= names
    assert "credit_iter_000003_gae.png" not in names  # no values in this run
    assert [v["iteration"] for v in report["data"]["iterations"]] == [1, 2, 3]


def test_page_drives_in_chromium(browser, report: dict) -> None:
    data, d = report["data"], browser
    view = data["iterations"][-1]
    assert Select(d.find_element(By.ID, "iteration-select")).first_selected_option.text == "3"
    group = view["groups"][0]
    check_column(d, "#column-left", group, view["estimators"]["trained"]["adv"][0])
    assert d.execute_script("return document.documentElement.scrollWidth") <= 1280  # no sideways scrolling

    # the run's own advantages, then an estimator recomputed offline
    est = d.find_element(By.ID, "estimator-select")
    Select(est).select_by_value("reinforce")
    assert d.find_element(By.ID, "column-left").get_attribute("data-estimator") == "reinforce"
    shown = check_column(d, "#column-left", group, view["estimators"]["reinforce"]["adv"][0])
    assert [t[0] for t in shown] != pytest.approx(flat(view["estimators"]["trained"]["adv"][0]), abs=1e-6)

    # credit precision: the page's number is the hand-computed one
    expected = hand_precision(group, view["estimators"]["reinforce"]["adv"][0])
    p = d.find_element(By.ID, "credit-precision")
    assert p.text == ("n/a" if expected is None else f"{100 * expected:.1f}%")
    if expected is not None:
        assert float(p.get_attribute("data-value")) == pytest.approx(expected, abs=1e-9)

    # side by side: grpo on the right, one colour scale for both columns
    Select(d.find_element(By.ID, "compare-select")).select_by_value("grpo")
    check_column(d, "#column-right", group, view["estimators"]["grpo"]["adv"][0])
    both = flat(view["estimators"]["reinforce"]["adv"][0]) + flat(view["estimators"]["grpo"]["adv"][0])
    legend = float(d.find_element(By.ID, "legend-max").get_attribute("data-value"))
    assert legend == pytest.approx(max(abs(a) for a in both), abs=1e-6)
    Select(est).select_by_value("gae")
    assert "needs values" in d.find_element(By.ID, "unavailable").text

    # another iteration: other prompts and tokens
    Select(est).select_by_value("trained")
    before = d.find_element(By.ID, "prompt").text, [t[2] for t in d.execute_script(TOKENS_JS, "#column-left")]
    Select(d.find_element(By.ID, "iteration-select")).select_by_index(0)
    first = data["iterations"][0]
    toks = check_column(d, "#column-left", first["groups"][0], first["estimators"]["trained"]["adv"][0])
    assert (d.find_element(By.ID, "prompt").text, [t[2] for t in toks]) != before
    assert d.find_element(By.ID, "prompt").text.startswith(first["groups"][0]["prompt"])


def test_keyboard_and_mouse(browser, report: dict) -> None:
    data, d = report["data"], browser
    d.get((report["dir"] / "index.html").as_uri())
    body = d.find_element(By.TAG_NAME, "body")
    value = lambda sid: d.find_element(By.ID, sid).get_attribute("value")  # noqa: E731
    body.send_keys(Keys.ARROW_LEFT)
    assert value("iteration-select") == "1"  # index of iteration 2
    body.send_keys(Keys.ARROW_RIGHT)
    assert value("iteration-select") == "2"
    body.send_keys(Keys.ARROW_DOWN)
    assert value("group-select") == "1"
    assert d.find_element(By.ID, "prompt").text.startswith(data["iterations"][2]["groups"][1]["prompt"])
    body.send_keys("j")
    assert d.find_element(By.CSS_SELECTOR, ".response.selected").get_attribute("data-response") == "1"
    body.send_keys("k")
    assert d.find_element(By.CSS_SELECTOR, ".response.selected").get_attribute("data-response") == "0"
    order = data["iterations"][2]["order"]
    body.send_keys("e")
    assert value("estimator-select") == order[1]
    body.send_keys("c")
    assert d.find_element(By.ID, "column-right").get_attribute("data-estimator") == order[0]
    token = d.find_elements(By.CSS_SELECTOR, "#column-left .response")[2].find_elements(By.CSS_SELECTOR, ".tok")[1]
    token.click()
    assert d.find_element(By.CSS_SELECTOR, ".response.selected").get_attribute("data-response") == "2"
    assert d.find_element(By.ID, "detail").text.startswith("response #2, token 1 ")

    chart = d.find_element(By.CSS_SELECTOR, ".chart svg")  # its left edge: the first iteration
    ActionChains(d).move_to_element_with_offset(chart, -int(chart.size["width"]) // 2 + 26, 0).click().perform()
    assert value("iteration-select") == "0"

    shot = report["dir"] / "screenshot.png"
    assert d.save_screenshot(str(shot))
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (1280, 800)


def test_cli_screenshot_is_a_1280x800_png(report: dict, tmp_path) -> None:
    png = tmp_path / "shot.png"
    assert (
        main(["inspect", str(report["run"]), "--out", str(tmp_path / "r"), "--no-png", "--screenshot", str(png)]) == 0
    )
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == (1280, 800)


def without_spread(g: dict, group_id: int, *, kept: bool = True) -> dict:
    """``g`` with every completion scored 0 (or dropped), as the run's grpo would credit it: all 0."""
    out = copy.deepcopy(g)
    out["group_id"] = group_id
    for r in out["responses"]:
        n = len(r["tokens"])
        r.update(rewards=[0.0] * n, adv=[0.0] * n, ret=[0.0] * n, outcome=0.0, kept=kept)
    return out


@pytest.fixture(scope="module")
def spread_pages(report: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The run's last saved iteration plus a group without reward spread and an all-dropped one,
    and an iteration 4 with only those two; pages opening at iteration 3, filter off and on."""
    root = tmp_path_factory.mktemp("spread")
    (root / "run" / "inspect").mkdir(parents=True)
    rec = json.loads((report["run"] / "inspect" / "iter_000003.json").read_text())
    flat = [without_spread(rec["groups"][0], 900), without_spread(rec["groups"][0], 901, kept=False)]
    rec["groups"] += flat
    later = dict(rec, iteration=4, groups=flat)
    for r in (rec, later):
        (root / "run" / "inspect" / f"iter_{r['iteration']:06d}.json").write_text(json.dumps(r))
    pages = {}
    for only in (False, True):
        out = root / f"report_{only}"
        build_report(root / "run", iteration=3, estimators="grpo,reinforce", out=out, png=False, only_spread=only)
        pages[only] = (out / "index.html").as_uri()
    blob = re.search(r'id="inspector-data">(.*?)</script>', (root / "report_False" / "index.html").read_text(), re.S)
    return {"pages": pages, "data": json.loads(blob.group(1))}


def group_options(d) -> list[tuple[str, str]]:
    return [
        (o.get_attribute("value"), o.get_attribute("data-spread"))
        for o in d.find_elements(By.CSS_SELECTOR, "#group-select option")
    ]


def test_reward_spread_notes_counts_and_filter(browser, spread_pages: dict) -> None:
    d, view = browser, spread_pages["data"]["iterations"][0]
    d.get(spread_pages["pages"][False])
    groups = view["groups"]
    spread = [str(i) for i, g in enumerate(groups) if g["spread"]]
    n, flat, dropped = len(groups), str(len(groups) - 2), str(len(groups) - 1)
    assert not d.find_element(By.ID, "spread-filter").is_selected() and len(group_options(d)) == n
    count = d.find_element(By.ID, "spread-count")
    assert (count.get_attribute("data-none"), count.get_attribute("data-groups")) == (str(n - len(spread)), str(n))
    assert count.text.startswith(view["spread"]["text"] + " (") and "over all 2 iterations" in count.text

    # the group without spread says why, where its credit precision is
    Select(d.find_element(By.ID, "group-select")).select_by_value(flat)
    assert d.find_element(By.ID, "credit-precision").text == "n/a"
    assert d.find_element(By.ID, "credit-why").text == (
        "(no reward spread: all 4 completions scored 0, so every advantage is 0)"
    )
    assert d.find_element(By.ID, "spread-note").text == "no reward spread: all 4 completions scored 0"
    assert "grpo n/a (no reward spread)" in d.find_element(By.ID, "precision-table").text
    Select(d.find_element(By.ID, "group-select")).select_by_value(dropped)
    assert d.find_element(By.ID, "credit-why").text == (
        "(no credit: all 4 completions were dropped, so every advantage is 0)"
    )
    # and a group with spread does not
    Select(d.find_element(By.ID, "group-select")).select_by_value(spread[0])
    assert not d.find_elements(By.ID, "spread-note")
    why = d.find_elements(By.ID, "credit-why")
    expected = view["estimators"]["trained"]["precision"]["groups"][int(spread[0])]["why"]
    assert [w.text for w in why] == ([f"({expected})"] if expected else [])
    assert all("reward spread" not in w.text for w in why)

    # the filter: only groups with spread are listed and stepped through; a hidden selection moves
    Select(d.find_element(By.ID, "group-select")).select_by_value(flat)
    d.find_element(By.ID, "spread-filter").click()
    assert group_options(d) == [(i, "1") for i in spread]
    assert d.find_element(By.ID, "group-select").get_attribute("value") == spread[0]
    body = d.find_element(By.TAG_NAME, "body")
    seen = []
    for _ in range(len(spread)):
        body.send_keys(Keys.ARROW_DOWN)
        seen.append(d.find_element(By.ID, "group-select").get_attribute("value"))
        assert not d.find_elements(By.ID, "spread-note")
    assert seen == spread[1:] + spread[:1]  # every shown group once, cyclically, none hidden
    body.send_keys(Keys.ARROW_RIGHT)  # iteration 4: no group with spread at all
    assert group_options(d) == [("-1", None)]
    assert d.find_element(By.ID, "spread-note").text.startswith("no saved group of iteration 4 has reward spread")
    assert not d.find_elements(By.CSS_SELECTOR, "#columns .response")
    body.send_keys("s")  # the key turns the filter off again
    assert not d.find_element(By.ID, "spread-filter").is_selected() and len(group_options(d)) == 2
    body.send_keys(Keys.ARROW_LEFT)
    d.find_element(By.ID, "spread-filter").click()
    d.find_element(By.ID, "spread-filter").click()
    assert len(group_options(d)) == n and len(d.find_elements(By.CSS_SELECTOR, "#column-left .response")) > 0

    # build_report(only_spread=True): the page opens with the filter on
    d.get(spread_pages["pages"][True])
    assert d.find_element(By.ID, "spread-filter").is_selected()
    assert group_options(d) == [(i, "1") for i in spread]
