"""The pages of `qkv explain/context/compare --html` and `qkv explain --svg`, opened in headless
Chromium: no console errors, the numbers shown are the weights qkv computed (read back from the
DOM and compared with `qkv explain --json`), the head/query selectors move the highlighted row,
screenshots are not blank, markup in the input runs nothing, 512 tokens render in time and 4,096
tokens give the top-k page without N×N memory. Fails (never skips) without Chromium."""
import json
import math
import resource
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from html_browser_util import assert_not_blank, errors, image, parse_rgb, scale_colour
from qkv_testlib import VOCABULARY


def qkv_ok(run, *args):
    r = run(*args)
    assert r.returncode == 0, f"qkv {' '.join(map(str, args))[:200]}: {r.stderr}"
    return r


def explain_json(run, *args):
    return json.loads(qkv_ok(run, "explain", *args, "--json").stdout)


def words(rng, n):
    return " ".join(rng.choice(VOCABULARY, size=n))


def js(browser, script, *args):
    return browser.driver.execute_script(script, *args)


CELLS = "return Array.from(document.querySelectorAll('#heatmap rect.cell')).map(r => [+r.dataset.i, +r.dataset.j, r.dataset.w]);"
SELECTED = "return Array.from(document.querySelectorAll('#heatmap rect.cell.sel')).map(r => [+r.dataset.i, +r.dataset.j, r.dataset.w]);"


def assert_cells_are(cells, weights, what):
    n = len(weights)
    assert len(cells) == n * n, f"{what}: {len(cells)} cells for {n} tokens"
    for i, j, w in cells:
        # data-w holds the shortest text of the double: it must read back as exactly the same number.
        assert float(w) == weights[i][j], f"{what}: cell ({i}, {j}) shows {w}, qkv computed {weights[i][j]!r}"


def choose(browser, select_id, value):
    from selenium.webdriver.support.ui import Select
    Select(browser.driver.find_element("id", select_id)).select_by_value(str(value))


def test_seed003_page_shows_qkvs_weights_and_draws_them(run, tmp_path, browser):
    page = tmp_path / "explain.html"
    qkv_ok(run, "explain", "--html", page)
    expected = json.loads(qkv_ok(run, "explain", "--json").stdout)
    log = browser.open(page)
    assert errors(log) == [], log
    assert_cells_are(js(browser, CELLS), expected["heads"][0]["weights"], "seed 003")
    # The formula of the selected query is its row of weights, term by term.
    terms = js(browser, "return Array.from(document.querySelectorAll('#formula .term')).map(t => [+t.dataset.j, t.dataset.w]);")
    assert [(j, float(w)) for j, w in terms] == [(j, w) for j, w in enumerate(expected["heads"][0]["weights"][0])]
    # Every step is on the page as a labelled matrix.
    names = js(browser, "return Array.from(document.querySelectorAll('figure.matrix')).map(f => f.dataset.name);")
    for step in ("X", "W_q", "W_k", "W_v", "Q", "K", "V", "raw scores", "scaled scores", "weights", "context"):
        assert step in names, f"step {step} missing from {names}"
    # The screenshot shows the page, and a cell's pixels have the colour its rect asks for.
    png = browser.driver.get_screenshot_as_png()
    (tmp_path / "explain.png").write_bytes(png)
    assert_not_blank(png, "seed 003 page")
    svg = browser.driver.find_element("id", "heatmap-svg")
    shot = image(svg.screenshot_as_png)
    for i, j in ((0, 0), (2, 1)):
        x, y, w, fill = js(browser, """const r = document.querySelector(`#heatmap rect.cell[data-i="${arguments[0]}"][data-j="${arguments[1]}"]`);
            return [+r.getAttribute('x'), +r.getAttribute('y'), +r.getAttribute('width'), r.getAttribute('fill')];""", i, j)
        got = shot.getpixel((int(x + w / 4), int(y + w / 4)))
        assert max(abs(a - b) for a, b in zip(got, parse_rgb(fill))) <= 3, f"cell ({i}, {j}) drawn {got}, fill {fill}"


def test_heads_and_query_selectors_move_the_highlighted_row(run, tmp_path, embeddings, seed, browser):
    rng = np.random.default_rng(seed)
    sentence = words(rng, 7)
    args = ["--embeddings", embeddings.glove, sentence, "--heads", "3", "--dk", "2", "--seed", str(seed % 1000)]
    page = tmp_path / "heads.html"
    qkv_ok(run, "explain", *args, "--html", page)
    heads = explain_json(run, *args)["heads"]
    weights = [h["weights"] for h in heads]
    assert errors(browser.open(page)) == []
    msg = f"seed {seed}, sentence {sentence!r}"
    assert_cells_are(js(browser, CELLS), weights[0], msg)
    previous = (0, 0, js(browser, "return document.getElementById('row-highlight').getAttribute('y');"))
    for head, row in ((2, 0), (2, 5), (1, 5), (1, 3)):
        choose(browser, "head-select", head)
        choose(browser, "query-select", row)
        assert js(browser, "return document.getElementById('heatmap').dataset.head;") == str(head)
        assert_cells_are(js(browser, CELLS), weights[head], f"{msg}, head {head + 1}")
        selected = js(browser, SELECTED)
        assert sorted((i, j) for i, j, _ in selected) == [(row, j) for j in range(7)], msg
        assert [float(w) for _, _, w in sorted(selected)] == weights[head][row], msg
        # The highlight frames the chosen row: at its cells' y, moved when the row changed.
        y = js(browser, "return document.getElementById('row-highlight').getAttribute('y');")
        assert y == js(browser, f"return document.querySelector('#heatmap rect.cell[data-i=\"{row}\"]').getAttribute('y');")
        assert (y != previous[2]) == (row != previous[1]), f"{msg}: highlight at y={y} for row {row}, before {previous}"
        previous = (head, row, y)
        # Only the chosen head's steps are shown.
        shown = js(browser, "return Array.from(document.querySelectorAll('.head-steps')).filter(s => !s.hidden).map(s => +s.dataset.head);")
        assert shown == [head], msg
        terms = js(browser, "return Array.from(document.querySelectorAll('#formula .term')).map(t => t.dataset.w);")
        assert [float(w) for w in terms] == weights[head][row], msg
        # The terms table ends with their sum: the query's context vector.
        total = js(browser, "const r = document.querySelector('#terms tr:last-child'); return r.cells[r.cells.length - 1].textContent;")
        np.testing.assert_allclose(json.loads(total), heads[head]["context"][row], atol=5.1e-5, err_msg=msg)
    # Hovering a cell shows its exact value.
    from selenium.webdriver import ActionChains
    cell = browser.driver.find_element("css selector", '#heatmap rect.cell[data-i="4"][data-j="6"]')
    ActionChains(browser.driver).move_to_element(cell).perform()
    readout = browser.driver.find_element("id", "readout")
    assert float(readout.get_attribute("data-w")) == weights[1][4][6], msg
    assert repr(weights[1][4][6])[:8] in readout.text, readout.text
    assert errors(browser.driver.get_log("browser")) == []


def test_markup_in_the_input_is_shown_as_text_and_runs_nothing(run, tmp_path, embeddings, browser):
    from selenium.common.exceptions import NoAlertPresentException
    evil = "<script>alert(1)</script> \"quoted\" 'single' </script><img src=x onerror=alert(2)>"
    sentence = f"i am going {evil} to the bank"
    glove = tmp_path / "v<img src=x onerror=alert(3)>'\".txt"  # a file name cannot hold "/"
    glove.write_bytes(embeddings.glove.read_bytes())
    pages = [tmp_path / "evil.html", tmp_path / "evil-context.html", tmp_path / "evil-compare.html"]
    qkv_ok(run, "explain", "--embeddings", glove, "--random-weights", "0", sentence, "--oov", "zero", "--html", pages[0])
    qkv_ok(run, "context", "--embeddings", glove, "--random-weights", "0", sentence, "--oov", "zero", "--html", pages[1])
    qkv_ok(run, "compare", "--embeddings", glove, "--random-weights", "0", "--oov", "zero", "--word", "bank", sentence, "by the river bank",
           "--html", pages[2])
    for page in pages:
        log = browser.open(page)
        with pytest.raises(NoAlertPresentException):
            browser.driver.switch_to.alert.text
        assert errors(log) == [], f"{page.name}: {log}"
        assert js(browser, "return document.querySelectorAll('script').length;") == 2, page.name
        assert js(browser, "return document.querySelectorAll('img').length;") == 0, page.name
        body = browser.driver.find_element("tag name", "body").text
        if page != pages[2]:
            assert "<script>alert(1)</script>" in body, f"{page.name}: the sentence is not shown as text"
            assert str(glove.name) in body, f"{page.name}: the file name is not shown as text"
        else:
            assert evil in body


def test_svg_parses_and_its_cells_are_the_weights(run, tmp_path, embeddings, seed):
    rng = np.random.default_rng(seed)
    sentence = words(rng, 5)
    args = ["--embeddings", embeddings.glove, sentence, "--heads", "2", "--dk", "3"]
    qkv_ok(run, "explain", *args, "--svg", tmp_path / "h.svg")
    weights = [h["weights"] for h in explain_json(run, *args)["heads"]]
    root = ET.parse(tmp_path / "h.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    seen = 0
    for group in root.iter("{http://www.w3.org/2000/svg}g"):
        if group.get("class") != "head":
            continue
        h = int(group.get("data-head"))
        for rect in group.iter("{http://www.w3.org/2000/svg}rect"):
            if rect.get("class") == "cell":
                i, j = int(rect.get("data-i")), int(rect.get("data-j"))
                assert float(rect.get("data-w")) == weights[h][i][j], f"seed {seed}: head {h} cell ({i}, {j})"
                assert rect.find("{http://www.w3.org/2000/svg}title") is not None
                seen += 1
    assert seen == 2 * 5 * 5


def test_512_tokens_render_in_time_and_hover_shows_the_weights(run, tmp_path, embeddings, seed, browser):
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    rng = np.random.default_rng(seed)
    sentence = words(rng, 512)
    args = ["--embeddings", embeddings.glove, sentence, "--dk", "4"]
    page = tmp_path / "512.html"
    qkv_ok(run, "explain", *args, "--html", page)
    weights = np.array(explain_json(run, *args)["heads"][0]["weights"])
    assert weights.shape == (512, 512)
    start = time.monotonic()
    log = browser.open(page)
    canvas = browser.driver.find_element("id", "heatmap-canvas")
    elapsed = time.monotonic() - start
    assert elapsed < 15, f"the 512-token page took {elapsed:.1f} s to render"
    assert errors(log) == [], log
    # The page's own data (what the canvas and the hover read) holds qkv's weights exactly.
    shown = np.array(js(browser, "return JSON.parse(document.getElementById('qkv-data').textContent).heads[0].weights;"))
    assert np.array_equal(shown, weights), f"seed {seed}"
    cell = int(canvas.get_attribute("width")) // 512
    js(browser, "arguments[0].scrollIntoView({block: 'center'});", canvas)
    left, top = js(browser, "const b = arguments[0].getBoundingClientRect(); return [b.left, b.top];", canvas)
    hovered = 0
    for _ in range(200):
        i, j = (int(x) for x in rng.integers(0, 512, size=2))
        x, y = int(left + j * cell + cell / 2), int(top + i * cell + cell / 2)
        # Only cells the scroll box shows can be hovered.
        if js(browser, "return document.elementFromPoint(arguments[0], arguments[1]) === arguments[2];", x, y, canvas) is not True:
            continue
        actions = ActionBuilder(browser.driver)
        actions.pointer_action.move_to_location(x, y)
        actions.perform()
        hovered += 1
        r = browser.driver.find_element("id", "readout")
        assert (int(r.get_attribute("data-i")), int(r.get_attribute("data-j"))) == (i, j), f"seed {seed}"
        assert float(r.get_attribute("data-w")) == weights[i, j], f"seed {seed}: ({i}, {j})"
        if hovered == 12:
            break
    assert hovered == 12, f"only {hovered} cells of the canvas were in view"
    # Choosing a query moves the highlight to its row.
    choose(browser, "query-select", 300)
    top = js(browser, "return document.getElementById('row-highlight').style.top;")
    assert top == f"{300 * cell}px", top
    png = canvas.screenshot_as_png
    (tmp_path / "512.png").write_bytes(png)
    assert_not_blank(png, "512-token heatmap", min_colours=16, min_ink=0.2)


def peak_rss_of(cmd):
    """Peak resident set size (bytes) of `cmd` run in a fresh Python, so nothing else is counted."""
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    r = subprocess.run([sys.executable, "-c", probe, *map(str, cmd)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split()[-1]) * 1024


def test_4096_tokens_give_the_top_k_page_without_n_by_n_memory(qkv_bin, tmp_path, embeddings, seed, browser):
    rng = np.random.default_rng(seed)
    n = 4096
    tokens = list(rng.choice(VOCABULARY, size=n))
    page = tmp_path / "long.html"
    rss = peak_rss_of([qkv_bin, "explain", "--embeddings", embeddings.glove, " ".join(tokens), "--parameter-free",
                       "--html", page])
    # One N×N float64 matrix is 134 MB; the whole run must stay under a quarter of it.
    assert rss < n * n * 8 // 4, f"peak RSS {rss / 1e6:.1f} MB for {n} tokens"
    x = embeddings.x(tokens)
    s = x @ x.T / math.sqrt(x.shape[1])
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    log = browser.open(page)
    assert errors(log) == [], log
    assert "4096 tokens" in browser.driver.find_element("id", "topk-note").text
    for row in (0, 2500, 4095):
        box = browser.driver.find_element("id", "query-input")
        js(browser, "arguments[0].value = '';", box)  # clear() leaves the number input's "1" in place
        box.send_keys(str(row + 1) + "\n")  # the page numbers tokens from 1, as everywhere
        sel = js(browser, "return document.querySelector('#topk-table tr.sel').dataset.row;")
        assert sel == str(row)
        entries = js(browser, "return Array.from(document.querySelectorAll('#topk-table tr.sel td.entry')).map(e => [+e.dataset.j, +e.dataset.w]);")
        assert len(entries) == 10
        expected = np.sort(w[row])[::-1][:10]
        got = np.array([v for _, v in entries])
        np.testing.assert_allclose(got, expected, rtol=2e-5, err_msg=f"seed {seed}, row {row}")
        for j, v in entries:
            assert abs(w[row, j] - v) <= 2e-5 * v, f"seed {seed}: row {row} key {j}"
        rest = float(js(browser, "return document.querySelector('#topk-table tr.sel td.rest').textContent;"))
        assert abs(rest - (1 - expected.sum())) < 1e-3
        # Each entry names the key's position, so repeated words can be told apart.
        texts = js(browser, "return Array.from(document.querySelectorAll('#topk-table tr.sel td.entry')).map(e => e.textContent);")
        assert [t.split(" ")[:2] for t in texts] == [[tokens[j], f"({j + 1})"] for j, _ in entries]
    # The colours are absolute by default: the scale ends at weight 1, whatever the largest weight listed.
    assert js(browser, "return document.getElementById('legend-max').dataset.max;") == "1"
    entry = js(browser, "const e = document.querySelector('#topk-table tr.sel td.entry'); return [+e.dataset.w, e.style.backgroundColor];")
    assert max(abs(a - b) for a, b in zip(parse_rgb(entry[1]), scale_colour(entry[0]))) <= 1, entry
    assert_not_blank(browser.driver.get_screenshot_as_png(), "top-k page")


def test_context_and_compare_pages(run, tmp_path, embeddings, seed, browser):
    layer = ["--heads", "2", "--dk", "3", "--seed", str(seed % 1000)]
    sentence = "i went to the bank to deposit money"
    page, out = tmp_path / "context.html", tmp_path / "context.json"
    r = qkv_ok(run, "context", "--embeddings", embeddings.glove, sentence, *layer, "--format", "json", "--out", out,
               "--html", page)
    assert r.stdout == "", "with --html the page replaces the text"
    table = json.loads(out.read_text())
    log = browser.open(page)
    assert errors(log) == [], log
    assert js(browser, "const c = document.getElementById('contextual'), s = document.getElementById('steps');"
                       "return !!(c.compareDocumentPosition(s) & Node.DOCUMENT_POSITION_FOLLOWING);"), "vectors first"
    cells = js(browser, "return Array.from(document.querySelectorAll('#contextual tbody tr')).map(r => Array.from(r.querySelectorAll('td')).map(c => +c.textContent));")
    np.testing.assert_allclose(np.array(cells), np.array(table["vectors"]), atol=6e-5, err_msg=f"seed {seed}")

    other = "we sat by the river bank"
    page = tmp_path / "compare.html"
    assert qkv_ok(run, "compare", "--embeddings", embeddings.glove, "--word", "bank", sentence, other, *layer,
                  "--html", page).stdout == ""
    log = browser.open(page)
    assert errors(log) == [], log
    for head in (0, 1):
        choose(browser, "head-select", head)
        for n, (text, position) in enumerate(((sentence, 4), (other, 5))):
            expected = explain_json(run, "--embeddings", embeddings.glove, text, *layer)["heads"][head]["weights"][position]
            chips = js(browser, f"return Array.from(document.querySelectorAll('#strip-{n} .chip')).map(c => +c.dataset.w);")
            np.testing.assert_allclose(chips, expected, rtol=1e-5, err_msg=f"seed {seed}, sentence {n + 1}, head {head + 1}")
            word = js(browser, f"return +document.querySelector('#strip-{n} .chip.word').dataset.j;")
            assert word == position
    assert_not_blank(browser.driver.get_screenshot_as_png(), "compare page")


def test_canvas_heatmap_follows_the_head_and_query(run, tmp_path, embeddings, seed, browser):
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    rng = np.random.default_rng(seed)
    args = ["--embeddings", embeddings.glove, words(rng, 61), "--heads", "2", "--dk", "3"]
    page = tmp_path / "canvas.html"
    qkv_ok(run, "explain", *args, "--html", page)
    weights = [h["weights"] for h in explain_json(run, *args)["heads"]]
    assert errors(browser.open(page)) == []
    choose(browser, "head-select", 1)
    choose(browser, "query-select", 40)
    canvas = browser.driver.find_element("id", "heatmap-canvas")  # drawn again for head 2
    cell = js(browser, "return Math.max(2, Math.min(12, Math.floor(900 / 61)));")
    offset = js(browser, "return [arguments[0].width - 61 * arguments[1], arguments[0].height - 61 * arguments[1]];", canvas, cell)
    hl = js(browser, "const s = document.getElementById('row-highlight').style; return [s.left, s.top, s.height];")
    assert hl == [f"{offset[0]}px", f"{offset[1] + 40 * cell}px", f"{cell}px"], f"seed {seed}: {hl}"
    js(browser, "arguments[0].scrollIntoView({block: 'center'});", canvas)
    left, top = js(browser, "const b = arguments[0].getBoundingClientRect(); return [b.left, b.top];", canvas)
    for i, j in ((40, 0), (40, 60), (3, 17)):
        actions = ActionBuilder(browser.driver)
        actions.pointer_action.move_to_location(int(left + offset[0] + j * cell + cell / 2), int(top + offset[1] + i * cell + cell / 2))
        actions.perform()
        r = browser.driver.find_element("id", "readout")
        assert float(r.get_attribute("data-w")) == weights[1][i][j], f"seed {seed}: head 2 ({i}, {j})"
    terms = js(browser, "return Array.from(document.querySelectorAll('#formula .term')).map(t => +t.dataset.j);")
    assert len(terms) == 12 and terms == sorted(terms)
    top12 = sorted(np.argsort(-np.array(weights[1][40]), kind="stable")[:12].tolist())
    assert terms == top12, f"seed {seed}: the formula shows the 12 largest weights of row 40"
    assert errors(browser.driver.get_log("browser")) == []


def test_picture_options_refuse_bad_requests_and_leave_no_files(run, tmp_path, embeddings, seed):
    from qkv_testlib import leftovers
    rng = np.random.default_rng(seed)
    long_sentence = words(rng, 1100)
    cases = [
        (["explain", "--embeddings", embeddings.glove, "--random-weights", "0", long_sentence, "--html", tmp_path / "a.html", "--svg", tmp_path / "a.svg"],
         "qkv: error: --svg: 1100 tokens is more than the 1024 a heatmap shows (--html lists the top-10 weights per row instead)\n"),
        (["explain", "--json", "--html", tmp_path / "b.html"],
         "qkv: explain: --json prints the steps; --html and --svg write pictures instead: choose one\n"),
        (["explain", "--html", tmp_path], f"qkv: error: --html {tmp_path}: is a directory\n"),
        (["explain", "--svg", tmp_path / "missing" / "c.svg"],
         f"qkv: error: --svg {tmp_path / 'missing' / 'c.svg'}: directory {tmp_path / 'missing'} does not exist\n"),
        (["context", "--embeddings", embeddings.glove, "--random-weights", "0", "i am", "--html", tmp_path], f"qkv: error: --html {tmp_path}: is a directory\n"),
    ]
    for args, message in cases:
        r = run(*args)
        assert r.returncode != 0 and r.stderr == message, (args[:3], r.returncode, r.stderr)
        assert leftovers(tmp_path, keep=("glove.txt", "w2v.txt", "w2v.bin")) == []


def test_real_words_page_has_axis_titles_and_each_head_its_own_map(qkv_bin, run, tmp_path, browser):
    from pathlib import Path
    real = Path(qkv_bin).parent / "data" / "words.txt"
    if not real.exists():
        pytest.skip(f"{real} not built (it takes minutes): `make demo` or `cmake --build build --target embeddings`")
    args = ["--embeddings", real, "we sat by the river bank", "--heads", "2", "--seed", "3"]
    page = tmp_path / "river.html"
    qkv_ok(run, "explain", *args, "--html", page)
    weights = [h["weights"] for h in explain_json(run, *args)["heads"]]
    assert errors(browser.open(page)) == []
    titles = js(browser, "return Array.from(document.querySelectorAll('#heatmap text.axis-title')).map(t => t.textContent);")
    assert titles == ["keys (columns): the tokens attended to", "queries (rows): the tokens attending"], titles
    keys = js(browser, "return Array.from(document.querySelectorAll('#heatmap text.key')).map(t => t.textContent);")
    assert keys == ["we", "sat", "by", "the", "river", "bank"]
    first = js(browser, CELLS)
    assert_cells_are(first, weights[0], "head 1")
    choose(browser, "head-select", 1)
    second = js(browser, CELLS)
    assert_cells_are(second, weights[1], "head 2")
    assert [w for _, _, w in first] != [w for _, _, w in second], "selecting head 2 left the map unchanged"
    assert "random (seed 3): query projection" in browser.driver.page_source
    png = browser.driver.find_element("id", "heatmap-svg").screenshot_as_png
    (tmp_path / "river.png").write_bytes(png)
    assert_not_blank(png, "real-words heatmap")
