"""The `qkv serve` page in headless Chromium: type a sentence, pick a word, switch layers and
toggles, and read back the numbers the page shows: they are what `qkv explain --json` and
`qkv compare --json` print for the same input and layer. Nothing overflows at 2, 12 and 60 tokens
(screenshots kept under the build tree, paths printed); hover and the keyboard read values out; a
sentence beyond the limit shows the server's message. Words that run right to left leave the numbers
in order, labels are cut between whole characters, the seed goes as typed, focus survives a redraw,
a late answer of the mode left behind writes nothing, and the words --oov zero or skip changed are
named. Fails (never skips) without Chromium."""
import contextlib
import json

import numpy as np
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from html_browser_util import Browser, assert_not_blank, assert_reads_in_order, errors, missing_browser
from serve_testlib import Server, artifacts_dir, cli_json, sentence_of, softmax_rows, write_words

HEADS = 2


@pytest.fixture(scope="module")
def served(qkv_bin, tmp_path_factory):
    words = write_words(tmp_path_factory.mktemp("serve") / "words.txt", seed=20261202)
    server = Server(qkv_bin, "--embeddings", words, "--heads", HEADS)
    yield server, words
    code, err = server.stop()
    assert code == 0, err


@pytest.fixture(scope="module")
def page(served):
    problem = missing_browser()
    if problem:
        pytest.fail(problem)
    b = Browser()
    b.driver.get(served[0].url)
    wait_explained(b.driver, "the cat chased the dog")
    yield b.driver
    b.close()


@pytest.fixture(autouse=True)
def no_console_errors(request):
    yield
    if "page" in request.fixturenames:
        driver = request.getfixturevalue("page")
        log = errors(driver.get_log("browser"))
        assert log == [], f"console errors: {log}"


def js(driver, script, *args):
    return driver.execute_script(script, *args)


def wait_explained(driver, sentence, timeout=20):
    """Waits until the latest request is answered and the page shows `sentence`'s tokens."""
    want = " ".join(sentence.split())
    WebDriverWait(driver, timeout).until(lambda d: js(d, """
        return !state.waiting && document.body.dataset.ready === String(state.seq) && state.data !== null &&
               state.data.explanation.tokens.join(' ') === arguments[0];""", want),
        f"the page never showed {want!r}")


def settle(driver, timeout=20):
    WebDriverWait(driver, timeout).until(
        lambda d: js(d, "return !state.waiting && document.body.dataset.ready === String(state.seq);"))


def type_into(driver, element_id, text):
    """Types like a user. A pause longer than the page's debounce sends a partial word, which the
    server refuses (not in the vocabulary): drain_partial_words() accepts those console errors."""
    box = driver.find_element(By.ID, element_id)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(text)


def drain_partial_words(driver):
    assert [e["message"] for e in errors(driver.get_log("browser")) if "status of 400" not in e["message"]] == []


def set_text(driver, element_id, text):
    """Replaces the text at once (one input event), as pasting does."""
    js(driver, """const box = document.getElementById(arguments[0]); box.value = arguments[1];
                  box.dispatchEvent(new Event('input', {bubbles: true}));""", element_id, text)


def show(driver, sentence, **toggles):
    """Sets the layer (layer=, seed=) and toggles, types `sentence`, waits for its answer."""
    if "seed" in toggles:
        set_text(driver, "seed", str(toggles["seed"]))
    layer = toggles.get("layer", "default")
    driver.find_element(By.CSS_SELECTOR, f"input[name=layer][value='{layer}']").click()
    for name in ("scaled", "positions", "causal"):
        box = driver.find_element(By.ID, name)
        if box.is_selected() != toggles.get(name, name == "scaled"):
            box.click()
    set_text(driver, "sentence", sentence)
    wait_explained(driver, sentence)


def cells(driver):
    """Every head's weights as the heatmaps hold them (data-w: the number's shortest text)."""
    rows = js(driver, """return Array.from(document.querySelectorAll('#heatmaps .heatmap')).map(h =>
        Array.from(h.querySelectorAll('rect.cell')).map(r => [+r.dataset.i, +r.dataset.j, r.dataset.w]));""")
    out = []
    for head in rows:
        n = int(round(len(head) ** 0.5))
        m = np.zeros((n, n))
        for i, j, w in head:
            m[i, j] = float(w)
        out.append(m)
    return out


def bars(driver):
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#bars .value")]


def cli_explain(run, words, sentence, *args):
    return cli_json(run, "explain", "--embeddings", words, *args, sentence)


def assert_page_shows(driver, cli, query=None):
    """The heatmaps, the selected word's bars and its context vector are the CLI's numbers (the word
    the page has selected unless `query` says which it must be)."""
    selected = js(driver, "return +document.querySelector('#tokens .token[aria-pressed=true]').dataset.index;")
    if query is not None:
        assert selected == query
    query = selected
    got = cells(driver)
    assert len(got) == len(cli["heads"])
    for h, head in enumerate(cli["heads"]):
        assert np.array_equal(got[h], np.array(head["weights"])), f"head {h + 1}'s heatmap differs from the CLI"
    row = cli["heads"][0]["weights"][query]
    assert bars(driver) == [f"{w:.4f}" for w in row]
    context = js(driver, "return Array.from(document.querySelectorAll('.context-value')).map(e => e.dataset.v);")
    assert [float(v) for v in context] == cli["heads"][0]["context"][query][:len(context)]


def test_typing_selecting_and_layers_match_the_cli(page, served, run):
    _, words = served
    sentence = "i went to the bank to deposit money"
    type_into(page, "sentence", sentence)
    wait_explained(page, sentence)
    drain_partial_words(page)
    assert not page.find_element(By.ID, "error").is_displayed()
    assert_page_shows(page, cli_explain(run, words, sentence, "--heads", HEADS))
    page.find_elements(By.CSS_SELECTOR, "#tokens .token")[4].click()  # "bank"
    settle(page)
    assert page.find_element(By.ID, "bars-query").text.startswith('"bank" (token 5)')
    assert_page_shows(page, cli_explain(run, words, sentence, "--heads", HEADS), query=4)
    show(page, sentence, layer="parameter-free")
    assert_page_shows(page, cli_explain(run, words, sentence, "--parameter-free"), query=4)
    show(page, sentence, layer="random", seed=5)
    assert_page_shows(page, cli_explain(run, words, sentence, "--heads", HEADS, "--seed", 5), query=4)


def test_toggles(page, served, run):
    _, words = served
    sentence = "we sat by the river bank"
    show(page, sentence, positions=True)
    assert_page_shows(page, cli_explain(run, words, sentence, "--heads", HEADS, "--positions"))
    cli = cli_explain(run, words, sentence, "--heads", HEADS)
    show(page, sentence, scaled=False)
    for h, m in enumerate(cells(page)):
        np.testing.assert_allclose(m, softmax_rows(cli["heads"][h]["scores"]), rtol=1e-12, atol=1e-15)
    show(page, sentence, causal=True)
    n = len(cli["tokens"])
    assert len(page.find_elements(By.CSS_SELECTOR, "#heatmaps rect.masked")) == HEADS * n * (n - 1) // 2
    for h, m in enumerate(cells(page)):
        np.testing.assert_allclose(m, softmax_rows(cli["heads"][h]["scaled_scores"], causal=True), rtol=1e-12,
                                   atol=1e-15)
    assert "Causal mask" in page.find_element(By.ID, "heatmap-caption").text


def test_word_order_without_and_with_positions(page):
    perm = [0, 4, 2, 3, 1]
    for positions in (False, True):
        show(page, "the cat chased the dog", layer="parameter-free", positions=positions)
        a = cells(page)[0]
        show(page, "the dog chased the cat", layer="parameter-free", positions=positions)
        b = cells(page)[0]
        same = np.allclose(b, a[np.ix_(perm, perm)], rtol=1e-12, atol=1e-15)
        assert same is (not positions), f"positions={positions}"


OVERFLOW = """
const W = document.documentElement.clientWidth, bad = [];
if (document.documentElement.scrollWidth > W) bad.push(`page is ${document.documentElement.scrollWidth} px wide, window ${W}`);
for (const e of document.querySelectorAll('body *')) {
  if (e.closest('[hidden]') || e.closest('defs, title, canvas')) continue;
  const r = e.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) continue;
  const box = e.closest('svg') && e.tagName !== 'svg' ? e.closest('svg').getBoundingClientRect()
            : e.parentElement.closest('.scroll-x') ? e.parentElement.closest('.scroll-x').getBoundingClientRect()
            : {left: 0, right: W};
  if (r.left < box.left - 1 || r.right > box.right + 1)
    bad.push(`${e.tagName}.${e.getAttribute('class')} "${(e.textContent || '').slice(0, 30)}": ${r.left.toFixed(0)}..${r.right.toFixed(0)} outside ${box.left.toFixed(0)}..${box.right.toFixed(0)}`);
}
return bad.slice(0, 10);"""


@pytest.mark.parametrize("width", [1400, 820])
@pytest.mark.parametrize("n", [2, 12, 60])
def test_nothing_overflows(page, served, qkv_bin, n, width):
    page.set_window_size(width, 1400)
    try:
        sentence = sentence_of(n)
        show(page, sentence)
        assert len(page.find_elements(By.CSS_SELECTOR, "#tokens .token")) == n
        assert js(page, OVERFLOW) == []
        path = artifacts_dir(qkv_bin) / f"serve-{n}-tokens-{width}px.png"
        png = page.get_screenshot_as_png()
        path.write_bytes(png)
        print(f"screenshot: {path}")
        assert_not_blank(png, f"{n} tokens at {width} px")
    finally:
        page.set_window_size(1400, 1400)


def test_limits_show_the_servers_message(page):
    show(page, "the cat chased the dog")
    set_text(page, "sentence", sentence_of(65))
    WebDriverWait(page, 20).until(lambda d: d.find_element(By.ID, "error").is_displayed())
    assert "has 65 words; the explorer shows at most 64" in page.find_element(By.ID, "error").text
    assert "stale" in page.find_element(By.ID, "explain-view").get_attribute("class")
    # The refused request is the one console error (Chromium logs every failed load).
    assert [e["message"] for e in errors(page.get_log("browser")) if "status of 400" not in e["message"]] == []
    show(page, "the cat chased the dog")
    assert not page.find_element(By.ID, "error").is_displayed()


def test_hover_and_keyboard_read_values(page):
    show(page, "the cat chased the dog")
    page.find_elements(By.CSS_SELECTOR, "#tokens .token")[0].click()
    cell = page.find_element(By.CSS_SELECTOR, "#heatmaps .heatmap rect.cell[data-i='1'][data-j='2']")
    ActionChains(page).move_to_element(cell).perform()
    w = float(cell.get_attribute("data-w"))
    readout = page.find_element(By.ID, "readout").text
    assert f'head 1: "cat" (2) → "chased" (3): weight {w:.4f}' in readout
    svg = page.find_element(By.CSS_SELECTOR, "#heatmaps svg")
    svg.send_keys(Keys.ARROW_DOWN, Keys.ARROW_DOWN, Keys.ARROW_RIGHT)
    assert page.find_element(By.ID, "readout").text.startswith('head 1: "chased" (3) → "cat" (2)')
    svg.send_keys(Keys.ENTER)
    assert page.find_elements(By.CSS_SELECTOR, "#tokens .token")[2].get_attribute("aria-pressed") == "true"
    # The tabs follow the arrow keys, and the sentence box is reachable with Tab.
    page.find_element(By.ID, "tab-explain").send_keys(Keys.ARROW_RIGHT)
    assert page.find_element(By.ID, "compare-view").is_displayed()
    page.find_element(By.ID, "tab-compare").send_keys(Keys.ARROW_LEFT)
    assert page.find_element(By.ID, "explain-view").is_displayed()
    settle(page)


def test_compare_mode_matches_the_cli(page, served, run, qkv_bin):
    _, words = served
    s1, s2 = "i went to the bank to deposit money", "we sat by the river bank"
    page.find_element(By.ID, "tab-compare").click()
    try:
        before = js(page, "return state.compareSeq;")
        set_text(page, "word", "bank")
        set_text(page, "sentence1", s1)
        type_into(page, "sentence2", s2)
        WebDriverWait(page, 20).until(lambda d: js(d, """return !state.waiting && document.body.dataset.compareReady === String(state.compareSeq)
            && state.compareSeq > arguments[0];""", before))
        drain_partial_words(page)
        assert not page.find_element(By.ID, "causal").is_enabled()
        cli = cli_json(run, "compare", "--embeddings", words, "--heads", HEADS, "--word", "bank", s1, s2)
        assert page.find_element(By.ID, "static-cosine").text == f"{cli['static_cosine']:.4f}"
        assert page.find_element(By.ID, "contextual-cosine").text == f"{cli['contextual_cosine']:.4f}"
        lists = page.find_elements(By.CSS_SELECTOR, "#sides .nearest")
        for shown, side in zip(lists, cli["sentences"]):
            assert [li.text for li in shown.find_elements(By.TAG_NAME, "li")] == \
                [f"{w['word']} {w['cosine']:.4f}" for w in side["nearest"]]
        values = [e.text for e in page.find_elements(By.CSS_SELECTOR, "#sides .bars .value")]
        assert values == [f"{w:.4f}" for side in cli["sentences"] for w in side["weights"][0]]
        assert js(page, OVERFLOW) == []
        path = artifacts_dir(qkv_bin) / "serve-compare.png"
        path.write_bytes(page.get_screenshot_as_png())
        print(f"screenshot: {path}")
    finally:
        page.find_element(By.ID, "tab-explain").click()
        settle(page)


# Words that run right to left: one holding a right-to-left override (U+202E), one in Hebrew.
OTHER_DIRECTIONS = ["\u202eevil", "\u05e9\u05dc\u05d5\u05dd"]


@pytest.fixture(scope="module")
def zero_server(qkv_bin, tmp_path_factory):
    """A server with --oov zero whose vocabulary also holds OTHER_DIRECTIONS: words outside it
    (emoji, accents) reach the page as tokens with zero vectors."""
    words = write_words(tmp_path_factory.mktemp("zero") / "words.txt", seed=20261207, extra=OTHER_DIRECTIONS)
    server = Server(qkv_bin, "--embeddings", words, "--heads", HEADS, "--oov", "zero")
    yield server
    code, err = server.stop()
    assert code == 0, err


@contextlib.contextmanager
def visiting(page, served, url):
    """The page of the server at `url` for the test's length, then the module's server's again."""
    page.get(url)
    wait_explained(page, "the cat chased the dog")
    try:
        yield
    finally:
        page.get(served[0].url)
        wait_explained(page, "the cat chased the dog")


def wait_compared(page, before):
    WebDriverWait(page, 20).until(lambda d: js(d, """return !state.waiting && state.compareSeq > arguments[0] &&
        document.body.dataset.compareReady === String(state.compareSeq);""", before))


def test_words_in_other_directions_leave_the_numbers_in_order(page, served, zero_server):
    """Every word shown beside other text is isolated: the numbers after it keep their order."""
    evil, hebrew = OTHER_DIRECTIONS
    with visiting(page, served, zero_server.url):
        show(page, f"the {evil} cat {hebrew} dog")
        for k in (1, 3):
            page.find_elements(By.CSS_SELECTOR, "#tokens .token")[k].click()
            js(page, "document.querySelector(`#heatmaps rect.cell[data-i='${arguments[0]}'][data-j='2']`)"
                     ".dispatchEvent(new Event('mouseenter'));", k)
            word = evil if k == 1 else hebrew
            assert page.find_element(By.ID, "readout").text.startswith(f'head 1: "{word}" ({k + 1}) → "cat" (3): weight ')
            for where in ("#readout", "#bars-query", "#context-caption", "#context tr.total td",
                          "#tokens .token[aria-pressed=true]"):
                assert_reads_in_order(page, page.find_element(By.CSS_SELECTOR, where), f"{where}, word {k + 1}")
        page.find_element(By.ID, "tab-compare").click()
        before = js(page, "return state.compareSeq;")
        set_text(page, "word", evil)
        set_text(page, "sentence1", f"the {evil} cat sat")
        set_text(page, "sentence2", f"a dog chased {hebrew} {evil}")
        wait_compared(page, before)
        assert not page.find_element(By.ID, "error").is_displayed()
        shown = page.find_elements(By.CSS_SELECTOR, "#cosine-values .cosine > div:first-child, #sides .side h3, "
                                                    "#sides .side p.caption, #sides .nearest li")
        assert len(shown) >= 2 + 2 * (1 + 2 + 5)
        for e in shown:
            assert_reads_in_order(page, e, "compare")


def test_a_late_answer_of_the_mode_left_behind_writes_nothing(page):
    """explain and compare share the message box: an answer of the mode the user left, arriving
    late, leaves the shown mode's message (or its absence) alone."""
    show(page, "the cat chased the dog")
    js(page, """window.realFetch = window.fetch;
        window.fetch = (path, options) => path === '/api/explain'
            ? new Promise((wait) => setTimeout(wait, 3000)).then(() => window.realFetch(path, options))
            : window.realFetch(path, options);""")
    message = "return document.getElementById('error').hidden ? '' : document.getElementById('error').textContent;"
    explained = "return document.body.dataset.ready === String(state.seq);"
    try:
        # A refused sentence's answer comes after the user switched to a comparison that worked.
        set_text(page, "sentence", "the cat zyzzyva")
        WebDriverWait(page, 20).until(lambda d: js(d, "return !state.waiting;"))
        before = js(page, "return state.compareSeq;")
        page.find_element(By.ID, "tab-compare").click()
        wait_compared(page, before)
        assert not js(page, explained), "the explain answer came before the comparison's"
        WebDriverWait(page, 20).until(lambda d: js(d, explained))
        assert js(page, message) == ""
        assert page.find_element(By.ID, "compare-status").text.startswith("layer: ")
        # A working sentence's answer comes after the user switched to a comparison that failed.
        js(page, "document.getElementById('sentence').value = 'the cat';")
        page.find_element(By.ID, "tab-explain").click()
        before = js(page, "return state.compareSeq;")
        page.find_element(By.ID, "tab-compare").click()
        set_text(page, "word", "zyzzyva")
        wait_compared(page, before)
        assert not js(page, explained), "the explain answer came before the comparison's"
        WebDriverWait(page, 20).until(lambda d: js(d, explained))
        assert "'zyzzyva': not in the vocabulary" in js(page, message)
        assert page.find_element(By.ID, "compare-status").text == "Not updated: see the message above."
    finally:
        js(page, "window.fetch = window.realFetch;")
        set_text(page, "word", "bank")
        page.find_element(By.ID, "tab-explain").click()
    show(page, "the cat chased the dog")
    drain_partial_words(page)


def test_the_seed_goes_as_typed(page, served, run):
    """Seeds past 2^53 reach the server digit for digit; anything but a whole number from 0 to
    2^64 - 1 is refused with a message, never changed into another seed."""
    _, words = served
    sentence = "the cat chased the dog"
    near = [cli_explain(run, words, sentence, "--heads", HEADS, "--seed", s) for s in ("9007199254740992",
                                                                                         "9007199254740993")]
    assert near[0]["heads"][0]["weights"] != near[1]["heads"][0]["weights"]  # a rounded seed would show
    for seed in ("9007199254740993", "18446744073709551615"):
        show(page, sentence, layer="random", seed=seed)
        assert not page.find_element(By.ID, "error").is_displayed()
        assert f"(seed {seed})" in page.find_element(By.ID, "status").text
        assert_page_shows(page, cli_explain(run, words, sentence, "--heads", HEADS, "--seed", seed))
    for seed in ("-5", "2.7", "18446744073709551616", "1e3", ""):
        set_text(page, "seed", seed)
        settle(page)
        assert page.find_element(By.ID, "error").text == \
            f'The seed must be a whole number from 0 to 18446744073709551615 (2^64 − 1), not "{seed}".'
        assert page.find_element(By.ID, "seed").get_attribute("aria-invalid") == "true"
        assert page.find_element(By.ID, "status").text == "Not updated: see the message above."
    show(page, sentence, layer="random", seed=5)
    assert not page.find_element(By.ID, "error").is_displayed()
    assert page.find_element(By.ID, "seed").get_attribute("aria-invalid") == "false"


def whole_characters(label, characters):
    """`label` is the word of `characters` (what a reader counts as one character each), or its
    first few and "…"."""
    word = "".join(characters)
    return label == word or (label.endswith("…") and any(label[:-1] == "".join(characters[:k])
                                                          for k in range(1, len(characters))))


def test_labels_cut_whole_characters(page, served, zero_server):
    faces, accents, families = ["😀"] * 10, ["e\u0301"] * 10, ["👨\u200d👩\u200d👧"] * 20
    with visiting(page, served, zero_server.url):
        show(page, " ".join(["the", "".join(faces), "".join(accents), "".join(families), "dog"]))
        # As JSON: a half of a surrogate pair would not pass the driver's own serialization.
        def texts(script, *args):
            return json.loads(js(page, f"return JSON.stringify({script});", *args))

        buttons = texts("Array.from(document.querySelectorAll('#tokens .token')).map((b) => b.firstChild.textContent)")
        assert buttons[1:4] == ["".join(faces), "".join(accents), "".join(families[:13]) + "…"], buttons
        bars = texts("Array.from(document.querySelectorAll('#bars .label')).map((b) => b.textContent)")
        assert bars[1:4] == ["".join(faces), "".join(accents), "".join(families[:15]) + "…"], bars
        for k, word in ((1, faces), (2, accents), (3, families)):
            page.find_elements(By.CSS_SELECTOR, "#tokens .token")[k].click()
            total = texts("document.querySelector('#context tr.total td').textContent")
            assert total.startswith('context of "') and total.endswith('"'), total
            labels = texts("""Array.from(document.querySelectorAll('#heatmaps .heatmap:first-child text'))
                .filter((t) => t.classList.contains('row-label') || t.classList.contains('col-label'))
                .map((t) => t.textContent).filter((t, i) => Math.floor(i / 2) === arguments[0])""", k)
            for label in [total[len('context of "'):-1], *labels]:
                assert whole_characters(label, word), (k, label)


def test_keyboard_focus_stays_on_the_redrawn_control(page):
    """Enter on a token, a head or a heatmap redraws them all; focus moves to the new control in
    the old one's place, so Tab carries on from there."""
    show(page, "the cat chased the dog")
    focused = "return document.activeElement === document.querySelectorAll(arguments[0])[arguments[1]];"
    js(page, "document.querySelectorAll('#tokens .token')[2].focus();")
    page.switch_to.active_element.send_keys(Keys.ENTER)
    assert js(page, "return state.query;") == 2
    assert js(page, focused, "#tokens .token", 2)
    page.switch_to.active_element.send_keys(Keys.TAB)
    assert js(page, focused, "#tokens .token", 3)
    js(page, "document.querySelectorAll('#head-picker button')[1].focus();")
    page.switch_to.active_element.send_keys(Keys.ENTER)
    assert js(page, "return state.head;") == 1
    assert js(page, focused, "#head-picker button", 1)
    js(page, "document.querySelectorAll('#heatmaps svg')[1].focus();")
    page.switch_to.active_element.send_keys(Keys.ARROW_DOWN, Keys.ENTER)
    assert js(page, "return state.query;") == 3
    assert js(page, focused, "#heatmaps svg", 1)
    js(page, "document.querySelectorAll('#head-picker button')[0].click();")


def test_missing_words_are_named(page, served, zero_server, qkv_bin):
    """--oov zero and skip: the page names the words not in the vocabulary, as the static page does."""
    _, words = served
    evil = OTHER_DIRECTIONS[0]
    note = "--oov zero gave {} of {} zero vectors, not being in the vocabulary: “zyzzyva” ×2, “{}”."
    with visiting(page, served, zero_server.url):
        assert page.find_element(By.ID, "oov-note").text == ""
        show(page, f"the zyzzyva cat zyzzyva {evil}1")
        shown = page.find_element(By.CSS_SELECTOR, "#oov-note .note")
        assert shown.text == note.format("3 words", "the sentence", f"{evil}1")
        assert_reads_in_order(page, shown, "the note")
        page.find_element(By.ID, "tab-compare").click()
        before = js(page, "return state.compareSeq;")
        set_text(page, "word", "cat")
        set_text(page, "sentence1", "the zyzzyva cat qq zyzzyva")
        set_text(page, "sentence2", "the cat")
        wait_compared(page, before)
        notes = [e.text for e in page.find_elements(By.CSS_SELECTOR, "#sides .note")]
        assert notes == [note.format("3 words", "sentence 1", "qq")]
    skip = Server(qkv_bin, "--embeddings", words, "--heads", HEADS, "--oov", "skip")
    try:
        with visiting(page, served, skip.url):
            set_text(page, "sentence", "the zyzzyva cat zyzzyva qq")  # its tokens: "the cat"
            settle(page)
            assert page.find_element(By.ID, "oov-note").text == (
                "--oov skip left 3 words out of the sentence, not being in the vocabulary: “zyzzyva” ×2, “qq”. "
                "The page shows the tokens that remain.")
    finally:
        code, err = skip.stop()
        assert code == 0, err
