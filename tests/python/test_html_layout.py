"""The pages of `qkv explain/context/compare --html` as a learner sees them, in headless Chromium at
2, 5, 12, 40 and 600 tokens: no axis title, axis label, legend text or word chip overflows the box
that holds it or overlaps another (getBoundingClientRect), the colour scale is absolute 0-1 with a
legend (row-max on request), a word --oov skip dropped is named on the page, words that run right to
left leave the numbers in order, labels are cut between whole characters, and no page scrolls
sideways on a 360 px phone. Screenshots of every page are kept under the build tree
(test-artifacts/html, path printed) for a person to look at. Fails (never skips) without Chromium."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from html_browser_util import assert_not_blank, assert_reads_in_order, errors
from qkv_testlib import VOCABULARY, write_glove

SIZES = (2, 5, 12, 40, 600)


@pytest.fixture(scope="module")
def artifacts(qkv_bin):
    path = Path(os.environ.get("QKV_TEST_ARTIFACTS", Path(qkv_bin).parent / "test-artifacts")) / "html"
    path.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots of the pages: {path}")
    return path


def qkv_ok(run, *args):
    r = run(*args, timeout=180)
    assert r.returncode == 0, f"qkv {' '.join(map(str, args))[:200]}: {r.stderr}"
    return r


def sentence(n, rng, must=None):
    """n real words of the test vocabulary (repeated and shuffled), with `must` somewhere inside."""
    words = list(rng.choice([w for w in VOCABULARY if w != must], size=n))
    if must:
        words[n // 2] = must
    return " ".join(words)


# Every text a learner reads on or around the heatmap, the word chips and the legend: each must lie
# inside its box (the SVG it is drawn in, the strip, the legend) and overlap no other text of that box.
LAYOUT = r"""
const TEXTS = ['#heatmap', '#close-up'].map(b => ['.axis-title', '.key', '.query', '.hm-caption'].map(c => b + ' ' + c))
              .flat().concat(['.strip .chip', '#legend > *', '#legend .tick']).join(', ');
const BOX = 'svg, .strip, #legend, .legend-scale, .hm-panel';
const problems = [], seen = [];
const name = e => (e.getAttribute('class') || e.tagName) + ' "' + (e.textContent || '').slice(0, 40) + '"';
const r4 = r => [r.left, r.top, r.right, r.bottom].map(v => Math.round(v * 10) / 10);
document.querySelectorAll(TEXTS).forEach(e => {
  const r = e.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) return;
  const box = e.parentElement.closest(BOX);
  if (!box) { problems.push(name(e) + ': in no box'); return; }
  const b = box.getBoundingClientRect();
  if (r.left < b.left - 0.5 || r.right > b.right + 0.5 || r.top < b.top - 0.5 || r.bottom > b.bottom + 0.5)
    problems.push(name(e) + ' ' + JSON.stringify(r4(r)) + ' overflows its ' + box.tagName + ' ' + JSON.stringify(r4(b)));
  seen.push([e, r, box]);
});
for (let a = 0; a < seen.length; a++)
  for (let b = a + 1; b < seen.length; b++) {
    const [ea, ra, ba] = seen[a], [eb, rb, bb] = seen[b];
    if (ba !== bb) continue;
    const w = Math.min(ra.right, rb.right) - Math.max(ra.left, rb.left);
    const h = Math.min(ra.bottom, rb.bottom) - Math.max(ra.top, rb.top);
    if (w > 0.5 && h > 0.5) problems.push(name(ea) + ' ' + JSON.stringify(r4(ra)) + ' overlaps ' + name(eb) + ' ' + JSON.stringify(r4(rb)));
  }
return [seen.length, problems.slice(0, 12), problems.length];
"""


def only_svg(script, texts):
    """LAYOUT for a standalone SVG: the texts `texts` (a CSS selector), each in its <svg> box."""
    lines = script.split("\n")
    start = next(k for k, line in enumerate(lines) if line.startswith("const TEXTS"))
    box = next(k for k, line in enumerate(lines) if line.startswith("const BOX"))
    return "\n".join(lines[:start] + [f"const TEXTS = '{texts}';", "const BOX = 'svg';"] + lines[box + 1:])


def check_layout(browser, what):
    count, problems, total = browser.driver.execute_script(LAYOUT)
    assert count > 0, f"{what}: no labels found"
    assert total == 0, f"{what}: {total} layout problems, e.g.\n  " + "\n  ".join(problems)
    return count


def look(browser, page, artifacts, name):
    """Opens the page, keeps its screenshots, and checks that nothing on it overflows or overlaps."""
    log = browser.open(page)
    assert errors(log) == [], f"{name}: {log}"
    png = browser.driver.get_screenshot_as_png()
    (artifacts / f"{name}.png").write_bytes(png)
    assert_not_blank(png, name)
    for element_id in ("close-up", "heatmap", "topk-table"):
        found = browser.driver.find_elements("id", element_id)
        if found:
            # Below the sticky head/query bar, which would cover the element's top in the screenshot.
            browser.driver.execute_script("arguments[0].scrollIntoView({block: 'start'}); const c = "
                                          "document.querySelector('.controls'); if (c) window.scrollBy(0, -c.offsetHeight - 4);",
                                          found[0])
            (artifacts / f"{name}-{element_id}.png").write_bytes(found[0].screenshot_as_png)
    return check_layout(browser, name)


def test_the_demo_pages_keep_their_axis_titles(run, tmp_path, browser, artifacts):
    page = tmp_path / "explain.html"
    qkv_ok(run, "explain", "--html", page)  # `make demo`'s page: seed 003, no sentence
    look(browser, page, artifacts, "explain-seed003")
    titles = browser.driver.execute_script(
        "return Array.from(document.querySelectorAll('#heatmap .axis-title')).map(t => t.textContent);")
    assert titles == ["keys (columns): the tokens attended to", "queries (rows): the tokens attending"], titles


@pytest.mark.parametrize("n", SIZES)
def test_explain_page_layout(run, tmp_path, embeddings, seed, browser, artifacts, n):
    rng = np.random.default_rng(seed)
    page = tmp_path / "e.html"
    qkv_ok(run, "explain", "--embeddings", embeddings.glove, sentence(n, rng), "--heads", "2", "--dk", "3",
           "--html", page)
    look(browser, page, artifacts, f"explain-{n}")


@pytest.mark.parametrize("n", SIZES)
def test_context_page_layout(run, tmp_path, embeddings, seed, browser, artifacts, n):
    rng = np.random.default_rng(seed)
    page = tmp_path / "c.html"
    qkv_ok(run, "context", "--embeddings", embeddings.glove, "--random-weights", "0", sentence(n, rng), "--html", page)
    look(browser, page, artifacts, f"context-{n}")


@pytest.mark.parametrize("n", SIZES)
def test_compare_page_layout(run, tmp_path, embeddings, seed, browser, artifacts, n):
    rng = np.random.default_rng(seed)
    page = tmp_path / "p.html"
    qkv_ok(run, "compare", "--embeddings", embeddings.glove, "--word", "bank", sentence(n, rng, "bank"),
           sentence(max(2, n // 2), rng, "bank"), "--heads", "2", "--html", page)
    look(browser, page, artifacts, f"compare-{n}")


def real_words():
    for candidate in (os.environ.get("QKV_EMBEDDINGS"), Path(__file__).parents[2] / "build" / "data" / "words.txt",
                      "/work/main/build/data/words.txt"):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    return None


def test_real_words_river_bank_page(run, tmp_path, browser, artifacts):
    words = real_words()
    if words is None:
        pytest.skip("no real word vectors (build/data/words.txt or $QKV_EMBEDDINGS): `make demo` builds them")
    page = tmp_path / "river.html"
    qkv_ok(run, "explain", "--embeddings", words, "--random-weights", "0", "we sat by the river bank", "--html", page)
    look(browser, page, artifacts, "explain-river-bank")


CELL_FILLS = "return Array.from(document.querySelectorAll('#heatmap rect.cell')).map(r => [+r.dataset.i, +r.dataset.j, +r.dataset.w, r.getAttribute('fill')]);"


@pytest.mark.parametrize("scale", ["absolute", "row", None])
def test_colours_are_absolute_unless_row_is_asked_for(run, tmp_path, embeddings, seed, browser, scale):
    from html_browser_util import parse_rgb, scale_colour
    rng = np.random.default_rng(seed)
    page = tmp_path / "s.html"
    qkv_ok(run, "explain", "--embeddings", embeddings.glove, "--random-weights", "0", sentence(9, rng), "--html", page,
           *(["--color-scale", scale] if scale else []))
    assert errors(browser.open(page)) == []
    cells = browser.driver.execute_script(CELL_FILLS)
    assert len(cells) == 81
    largest = {}
    for i, _, w, _ in cells:
        largest[i] = max(largest.get(i, 0), w)
    for i, j, w, fill in cells:
        t = w / largest[i] if scale == "row" else w
        assert max(abs(a - b) for a, b in zip(parse_rgb(fill), scale_colour(t))) <= 1, (seed, scale, i, j, w, fill)
    legend = browser.driver.execute_script(
        "const l = document.getElementById('legend'); return [l.dataset.scale, "
        "Array.from(l.querySelectorAll('.tick')).map(t => t.textContent), l.textContent];")
    if scale == "row":
        assert legend[0] == "row" and legend[1] == ["0", "25%", "50%", "75%", "row max"], legend
    else:
        assert legend[0] == "absolute" and legend[1] == ["0", "0.25", "0.5", "0.75", "1"], legend
    assert "Colours are absolute" in browser.driver.page_source if scale != "row" else "Colours are per row" in \
        browser.driver.page_source
    # The standalone SVG uses the same scale.
    import xml.etree.ElementTree as ET
    svg = tmp_path / "s.svg"
    qkv_ok(run, "explain", "--embeddings", embeddings.glove, "--random-weights", "0", "river bank money", "--svg", svg,
           *(["--color-scale", scale] if scale else []))
    rects = [r for r in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "cell"]
    rows = {}
    for r in rects:
        rows.setdefault(r.get("data-i"), []).append(float(r.get("data-w")))
    for r in rects:
        w = float(r.get("data-w"))
        t = w / max(rows[r.get("data-i")]) if scale == "row" else w
        assert max(abs(a - b) for a, b in zip(parse_rgb(r.get("fill")), scale_colour(t))) <= 1, (scale, w)


def test_standalone_svg_keeps_its_titles_and_labels_apart(run, tmp_path, embeddings, seed, browser, artifacts):
    rng = np.random.default_rng(seed)
    for n, heads in ((2, 1), (12, 2), (40, 1)):
        svg = tmp_path / f"h{n}.svg"
        qkv_ok(run, "explain", "--embeddings", embeddings.glove, sentence(n, rng), "--heads", str(heads), "--svg", svg)
        assert errors(browser.open(svg)) == []
        (artifacts / f"svg-{n}.png").write_bytes(browser.driver.get_screenshot_as_png())
        # Each head's panel is its box: the group's texts must stay inside the SVG and apart.
        count, problems, total = browser.driver.execute_script(only_svg(LAYOUT, "svg .axis-title, svg .key, svg .query, svg .tick"))
        assert count >= 2 * n + 2 and total == 0, f"{n} tokens: {problems}"


def test_skipped_words_are_named_on_every_page(run, tmp_path, embeddings, browser):
    text = "we sat by the zzyzx river bank qqq zzyzx"
    pages = {"explain": tmp_path / "e.html", "context": tmp_path / "c.html", "compare": tmp_path / "p.html"}
    base = ["--embeddings", embeddings.glove, "--random-weights", "0", "--oov", "skip"]
    qkv_ok(run, "explain", *base, text, "--html", pages["explain"])
    qkv_ok(run, "context", *base, text, "--html", pages["context"])
    qkv_ok(run, "compare", *base, "--word", "bank", text, "the bank qqq", "--html", pages["compare"])
    for kind, page in pages.items():
        assert errors(browser.open(page)) == []
        notes = [e for e in browser.driver.find_elements("css selector", ".note.oov") if e.is_displayed()]
        assert notes, f"{kind}: no visible note"
        assert notes[0].text == ("--oov skip left 3 words out of the sentence" if kind != "compare" else
                                 "--oov skip left 3 words out of sentence 1") + \
            ", not being in the vocabulary: “zzyzx” ×2, “qqq”. The page shows the tokens that remain.", notes[0].text
        if kind == "compare":
            assert len(notes) == 2 and notes[1].text.startswith(
                "--oov skip left 1 word out of sentence 2, not being in the vocabulary: “qqq”."), notes[1].text
    # Without skipped words, or with --oov zero (the words stay, as zero vectors), no note.
    qkv_ok(run, "explain", "--embeddings", embeddings.glove, "--random-weights", "0", "--oov", "zero", text, "--html", pages["explain"])
    assert errors(browser.open(pages["explain"])) == []
    assert browser.driver.find_elements("css selector", ".note.oov") == []


def test_hints_name_the_commands_real_options(run, tmp_path, embeddings, seed):
    rng = np.random.default_rng(seed)
    long = sentence(60, rng)  # tables beyond 48 rows show their corner and say where the rest is
    qkv_ok(run, "context", "--embeddings", embeddings.glove, "--random-weights", "0", long, "--html", tmp_path / "c.html")
    page = (tmp_path / "c.html").read_text()
    assert "qkv context --format json has all" in page and "; --json has all" not in page
    assert "qkv explain --json has all" in page  # the steps are explain's
    qkv_ok(run, "explain", "--embeddings", embeddings.glove, "--random-weights", "0", long, "--html", tmp_path / "e.html")
    page = (tmp_path / "e.html").read_text()
    assert "; --json has all" in page and "--format json" not in page


def test_html_replaces_the_text_on_every_command(run, tmp_path, embeddings):
    s = ["--embeddings", embeddings.glove, "--random-weights", "0"]
    for args in (["explain", *s, "river bank"], ["context", *s, "river bank"],
                 ["compare", *s, "--word", "bank", "the river bank", "the bank"]):
        assert qkv_ok(run, *args).stdout != "", args  # the text, without --html
        r = qkv_ok(run, *args, "--html", tmp_path / "p.html")
        assert r.stdout == "" and r.stderr == "", (args, r.stdout[:200], r.stderr)
        assert (tmp_path / "p.html").read_text().startswith("<!DOCTYPE html>")
    # context --out still gets its bytes beside the page.
    qkv_ok(run, "context", *s, "river bank", "--format", "json", "--out", tmp_path / "c.json", "--html", tmp_path / "c.html")
    assert json.loads((tmp_path / "c.json").read_text())["tokens"] == ["river", "bank"]


@pytest.mark.parametrize("args, message", [
    (["explain", "--html", "X", "--color-scale", "max"],
     "qkv: --color-scale: max not in {absolute,row}\n"),
    (["compare", "--word", "bank", "the bank", "a bank", "--json", "--html", "X"],
     "qkv: compare: --json prints the result; --html writes a page instead: choose one\n"),
    (["context", "the bank", "--format", "json", "--html", "X"],
     "qkv: context: --html writes a page instead of the text: give --out F for the --format json output, or leave "
     "one out\n"),
])
def test_page_options_refuse_bad_requests(run, tmp_path, embeddings, args, message):
    args = [a if a != "X" else tmp_path / "x.html" for a in args]
    r = run(args[0], "--embeddings", embeddings.glove, *args[1:])
    assert (r.returncode, r.stderr) == (2, message), (r.returncode, r.stderr)
    assert not (tmp_path / "x.html").exists()


def test_loss_chart_has_tick_values_on_both_axes(run, tmp_path, browser, artifacts):
    svg = tmp_path / "loss.svg"
    qkv_ok(run, "train", "--steps", "120", "--batch", "2", "--pairs", "2", "--keys", "4", "--values", "4", "-E", "8",
           "--eval-examples", "4", "--threads", "1", "--loss-svg", svg)
    assert errors(browser.open(svg)) == []
    (artifacts / "loss.png").write_bytes(browser.driver.get_screenshot_as_png())
    ticks = browser.driver.execute_script(
        "return ['x', 'y'].map(a => Array.from(document.querySelectorAll('text.tick.' + a)).map(t => t.textContent));")
    assert ticks[0][0] == "0" and float(ticks[0][-1]) <= 120 and len(ticks[0]) >= 4, ticks
    steps = [float(t) for t in ticks[0]]
    assert len({b - a for a, b in zip(steps, steps[1:])}) == 1, f"x ticks not evenly spaced: {ticks[0]}"
    assert len(ticks[1]) >= 3 and all(float(t) >= 0 for t in ticks[1]), ticks
    count, problems, total = browser.driver.execute_script(only_svg(LAYOUT, "svg text"))
    assert count >= 8 and total == 0, problems


def test_python_explain_html_shows_inline_in_a_notebook(tmp_path, browser, artifacts):
    import html
    import re
    qkv = pytest.importorskip("qkv", reason="the Python module is not built (PYTHONPATH=<build>/python)")
    page = qkv.explain(format="html")
    assert isinstance(page, str) and isinstance(page, qkv.HtmlPage)
    assert page.startswith("<!DOCTYPE html>") and 'id="heatmap"' in page
    fragment = page._repr_html_()
    # A fragment (no document of its own) that holds the whole page, escaped in an iframe's srcdoc.
    assert fragment.startswith("<iframe") and fragment.endswith("</iframe>") and "<!DOCTYPE" not in fragment
    srcdoc = re.fullmatch(r'<iframe [^>]*srcdoc="([^"]*)"></iframe>', fragment)
    assert srcdoc and html.unescape(srcdoc.group(1)) == page
    # Self-contained: nothing to fetch. Shown in a notebook-like page, its heatmap is drawn.
    assert "src=" not in page.replace("srcdoc", "") and "https:" not in page
    host = tmp_path / "notebook.html"
    host.write_text("<!DOCTYPE html><html><body><h1>Out[1]:</h1>" + fragment + "</body></html>")
    assert errors(browser.open(host)) == []
    frame = browser.driver.find_element("css selector", "iframe.qkv-page")
    browser.driver.switch_to.frame(frame)
    try:
        cells = browser.driver.execute_script("return document.querySelectorAll('#heatmap rect.cell').length;")
        tokens = browser.driver.execute_script("return JSON.parse(document.getElementById('qkv-data').textContent).tokens;")
        assert cells == len(tokens) ** 2 and cells > 0
        check_layout(browser, "notebook page")
    finally:
        browser.driver.switch_to.default_content()
    (artifacts / "notebook.png").write_bytes(browser.driver.get_screenshot_as_png())
    page.save(tmp_path / "saved.html")
    assert (tmp_path / "saved.html").read_text() == page
    assert "Colours are per row" in qkv.explain(format="html", color_scale="row")
    with pytest.raises(ValueError, match="color_scale must be 'absolute' or 'row', got 'max'"):
        qkv.explain(format="html", color_scale="max")


def test_a_long_input_gets_a_labelled_close_up_that_follows_the_overview(run, tmp_path, embeddings, seed, browser):
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    rng = np.random.default_rng(seed)
    page = tmp_path / "long.html"
    qkv_ok(run, "explain", "--embeddings", embeddings.glove, "--random-weights", "0", sentence(600, rng), "--html", page)
    assert errors(browser.open(page)) == []
    data = browser.driver.execute_script("return JSON.parse(document.getElementById('qkv-data').textContent);")
    weights, tokens, close = data["heads"][0]["weights"], data["tokens"], data["close_up"]

    def close_up():
        return browser.driver.execute_script(
            "return Array.from(document.querySelectorAll('#close-up rect.cell')).map(r => [+r.dataset.i, +r.dataset.j, +r.dataset.w]);")

    def check(row, col):
        cells = close_up()
        rows, cols = sorted({i for i, _, _ in cells}), sorted({j for _, j, _ in cells})
        assert len(rows) == len(cols) == close and row in rows and col in cols, (seed, row, col, rows[0], cols[0])
        assert rows == list(range(rows[0], rows[0] + close)) and cols == list(range(cols[0], cols[0] + close))
        for i, j, w in cells:
            assert w == weights[i][j], (seed, i, j)
        labels = browser.driver.execute_script(
            "return Array.from(document.querySelectorAll('#close-up text.query')).map(t => t.textContent);")
        assert labels == [f"{i + 1} {tokens[i][:16]}" for i in rows], labels[:3]
        check_layout(browser, f"close-up at ({row}, {col})")

    # Choosing a query centres the close-up on it and on the key it attends to most.
    from selenium.webdriver.support.ui import Select
    Select(browser.driver.find_element("id", "query-select")).select_by_value("300")
    check(300, int(np.argmax(weights[300])))
    # Clicking the overview moves the close-up to the clicked cell.
    canvas = browser.driver.find_element("id", "heatmap-canvas")
    cell = int(canvas.get_attribute("data-cell"))
    i, j = 400, 90
    # The overview scrolls inside its box: bring row i into the box's view, and the box into the window's.
    browser.driver.execute_script("const b = document.getElementById('heatmap'); b.scrollTop = arguments[0] - 100; "
                                  "b.scrollLeft = 0; b.scrollIntoView({block: 'center'});", i * cell)
    left, top = browser.driver.execute_script("const b = arguments[0].getBoundingClientRect(); return [b.left, b.top];", canvas)
    x, y = int(left + j * cell + cell / 2), int(top + i * cell + cell / 2)
    assert browser.driver.execute_script("return document.elementFromPoint(arguments[0], arguments[1]) === arguments[2];",
                                         x, y, canvas), "the overview's cell is not in view"
    actions = ActionBuilder(browser.driver)
    actions.pointer_action.move_to_location(x, y)
    actions.pointer_action.click()
    actions.perform()
    check(i, j)
    assert browser.driver.find_element("id", "query-select").get_attribute("value") == str(i)
    # At 600 tokens every weight is small: the page says the absolute colours are pale and what helps.
    assert "--color-scale row" in browser.driver.find_element("id", "legend-pale").text


# Words that run right to left: one holding a right-to-left override (U+202E), one in Hebrew.
OTHER_DIRECTIONS = ["\u202eevil", "\u05e9\u05dc\u05d5\u05dd"]


def test_words_in_other_directions_leave_the_numbers_in_order(run, tmp_path, seed, browser):
    """Every word shown beside other text is isolated: the numbers after it keep their order."""
    from selenium.webdriver.support.ui import Select
    evil, hebrew = OTHER_DIRECTIONS
    words = tmp_path / "words.txt"
    vocabulary = VOCABULARY + OTHER_DIRECTIONS
    write_glove(words, vocabulary, np.random.default_rng(seed).standard_normal((len(vocabulary), 6)))
    base = ["--embeddings", words, "--random-weights", "0"]
    d = browser.driver

    def check(*selectors):
        for selector in selectors:
            found = d.find_elements("css selector", selector)
            assert found, f"{selector}: not on the page"
            for e in found:
                assert_reads_in_order(d, e, selector)

    def hover(selector):
        d.execute_script("document.querySelector(arguments[0]).dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));",
                         selector)

    page = tmp_path / "e.html"
    qkv_ok(run, "explain", *base, "--heads", "2", f"we sat by the {evil} river {hebrew} bank", "--html", page)
    assert errors(browser.open(page)) == []
    for k in (4, 6):
        Select(d.find_element("id", "query-select")).select_by_value(str(k))
        hover(f"#heatmap rect.cell[data-i='{k}'][data-j='2']")
        assert d.find_element("id", "readout").text.startswith(f"head 1: “{evil if k == 4 else hebrew}” → “by” = 0.")
        check("#readout", "#formula")
    page = tmp_path / "p.html"
    qkv_ok(run, "compare", *base, "--word", evil, f"the {evil} bank", f"we sat by {hebrew} {evil} river", "--html", page)
    assert errors(browser.open(page)) == []
    hover("#strip-1 .chip[data-j='3']")
    check("header h1", ".cosines", ".side p:nth-of-type(2)", "#readout", "#formula-0", "#formula-1")
    page = tmp_path / "s.html"
    qkv_ok(run, "explain", *base, "--oov", "skip", f"we sat by the {evil}1 river {hebrew}2 bank", "--html", page)
    assert errors(browser.open(page)) == []
    check(".note.oov")
    page = tmp_path / "t.html"
    qkv_ok(run, "explain", *base, " ".join([evil, "bank", hebrew] * 400), "--html", page)
    assert errors(browser.open(page)) == []
    check("#topk-table tr.sel td.entry", "#query-token")


def test_labels_cut_whole_characters(run, tmp_path, embeddings, browser):
    """Labels longer than 16 characters are cut after 15 of the characters a reader sees, never
    inside an emoji or between a letter and its accent."""
    faces, accents = ["😀"] * 20, ["e\u0301"] * 20
    page = tmp_path / "e.html"
    qkv_ok(run, "explain", "--embeddings", embeddings.glove, "--random-weights", "0", "--oov", "zero",
           f"we sat by {''.join(faces)} the {''.join(accents)} bank", "--html", page)
    assert errors(browser.open(page)) == []
    # As JSON: a half of a surrogate pair would not pass the driver's own serialization.
    labels = json.loads(browser.driver.execute_script(
        "return JSON.stringify(Array.from(document.querySelectorAll('#heatmap text.key, #heatmap text.query'))"
        ".map((t) => t.textContent));"))
    for word in (faces, accents):
        assert labels.count("".join(word[:15]) + "…") == 2, labels


@pytest.mark.parametrize("kind", ["explain", "explain-60", "context", "compare", "top-k"])
def test_pages_fit_a_phone(run, tmp_path, embeddings, seed, browser, kind):
    """At 360 px the page never scrolls sideways: what is wider (tables, the heatmap) scrolls in
    its own box."""
    rng = np.random.default_rng(seed)
    base = ["--embeddings", embeddings.glove, "--random-weights", "0"]
    page = tmp_path / "p.html"
    if kind == "compare":
        qkv_ok(run, "compare", *base, "--word", "bank", sentence(12, rng, "bank"), sentence(5, rng, "bank"), "--html", page)
    else:
        n = {"explain": 5, "explain-60": 60, "context": 5, "top-k": 1100}[kind]
        qkv_ok(run, "context" if kind == "context" else "explain", *base, sentence(n, rng), "--html", page)
    d = browser.driver
    d.set_window_size(360, 900)
    try:
        assert errors(browser.open(page)) == []
        wide, window = d.execute_script("return [document.documentElement.scrollWidth, document.documentElement.clientWidth];")
        assert wide <= window, f"{kind}: the page is {wide} px wide in a {window} px window"
    finally:
        d.set_window_size(1400, 1400)
