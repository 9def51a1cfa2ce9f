"""The `qkv serve` page in headless Chromium: type a sentence, pick a word, switch layers and
toggles, and read back the numbers the page shows: they are what `qkv explain --json` and
`qkv compare --json` print for the same input and layer. Nothing overflows at 2, 12 and 60 tokens
(screenshots kept under the build tree, paths printed); hover and the keyboard read values out; a
sentence beyond the limit shows the server's message. Fails (never skips) without Chromium."""
import numpy as np
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from html_browser_util import Browser, assert_not_blank, errors, missing_browser
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
