"""Headless Chromium for the page tests (Debian's chromium + chromium-driver through Selenium), and
checks on what it shows: console errors, and screenshots that must not be blank."""
import io
import shutil
import tempfile
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions", "--window-size=1400,1400"]


def missing_browser():
    """What is missing to run the browser tests (install with scripts/install-deps.sh), or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is not installed (scripts/install-deps.sh installs chromium and chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "python3-selenium is not installed (scripts/install-deps.sh installs it)"
    try:
        import PIL  # noqa: F401
    except ImportError:
        return "python3-pil is not installed (scripts/install-deps.sh installs it)"
    return None


class Browser:
    """One Chromium with a fresh profile directory, removed on close."""
    def __init__(self):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        self.profile = tempfile.mkdtemp(prefix="qkv-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in FLAGS + [f"--user-data-dir={self.profile}"]:
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # An alert() left open must fail the next command, not be accepted silently.
        options.set_capability("unhandledPromptBehavior", "ignore")
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_page_load_timeout(30)

    def open(self, path):
        """Loads a page; returns the console messages of its loading (and clears them)."""
        self.driver.get(Path(path).resolve().as_uri())
        return self.driver.get_log("browser")

    def close(self):
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)


def errors(log):
    """The console entries that are errors (uncaught exceptions, console.error, failed loads)."""
    return [e for e in log if e.get("level") in ("SEVERE", "ERROR")]


# The pieces `arguments[0]` shows, in DOM order, that are not where that order says: each <bdi> (a
# word in its own bidi isolate) is one piece, every other visible character one piece, and each
# must lie right of the one before on its line (or on a later line). A word holding U+202E or
# right-to-left letters, shown outside an isolate, reverses what follows it: caught without a
# screenshot. Returns [pieces, up to 5 misplaced ones].
READING_ORDER = r"""
const pieces = [];
(function walk(node) {
  for (const c of node.childNodes) {
    if (c.nodeType === Node.ELEMENT_NODE && c.localName === 'bdi') pieces.push(['<bdi>' + c.textContent, c.getBoundingClientRect()]);
    else if (c.nodeType === Node.ELEMENT_NODE) walk(c);
    else if (c.nodeType === Node.TEXT_NODE) {
      let k = 0;
      for (const ch of c.textContent) {
        if (!/\s/.test(ch)) {
          const r = document.createRange();
          r.setStart(c, k);
          r.setEnd(c, k + ch.length);
          pieces.push([ch, r.getBoundingClientRect()]);
        }
        k += ch.length;
      }
    }
  }
})(arguments[0]);
const shown = pieces.filter(([, r]) => r.width > 0), bad = [];
for (let k = 1; k < shown.length; k++) {
  const [a, ra] = shown[k - 1], [b, rb] = shown[k];
  if (rb.top < ra.bottom - 1 && rb.left <= ra.left) bad.push(`${JSON.stringify(b)} at x=${rb.left.toFixed(1)} is not right of ${JSON.stringify(a)} at x=${ra.left.toFixed(1)}`);
}
return [shown.length, bad.slice(0, 5)];
"""


def assert_reads_in_order(driver, element, what):
    """`element`'s words and numbers appear in the order its text has them (READING_ORDER)."""
    count, bad = driver.execute_script(READING_ORDER, element)
    assert count > 1, f"{what}: nothing shown"
    assert bad == [], f"{what} ({element.text!r}): " + "; ".join(bad)


def image(png):
    from PIL import Image
    return Image.open(io.BytesIO(png)).convert("RGB")


def assert_not_blank(png, what, min_colours=24, min_ink=0.05):
    """A screenshot shows something: many distinct colours and a share of pixels that differ from
    its most common (background) colour."""
    img = image(png)
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None, f"{what}: too many colours to count"
    background = max(colours)[0]
    ink = 1.0 - background / (img.width * img.height)
    assert len(colours) >= min_colours, f"{what}: only {len(colours)} distinct colours: blank?"
    assert ink >= min_ink, f"{what}: only {ink:.1%} of pixels differ from the background"
    return img


def parse_rgb(text):
    """'rgb(12, 44, 132)' or '#0c2c84' as a tuple."""
    text = text.strip()
    if text.startswith("#"):
        return tuple(int(text[i:i + 2], 16) for i in (1, 3, 5))
    return tuple(int(v) for v in text[text.index("(") + 1:text.index(")")].split(","))


# The pages' colour scale (YlGnBu), written out here so the tests check colours against their own copy.
STOPS = [(255, 255, 217), (199, 233, 180), (127, 205, 187), (65, 182, 196), (29, 145, 192), (34, 94, 168),
         (12, 44, 132)]


def scale_colour(t):
    """The colour of `t` in [0, 1] on the pages' scale, as an (r, g, b) tuple."""
    t = min(max(t, 0.0), 1.0)
    n = len(STOPS) - 1
    a = min(int(t * n), n - 1)
    f = t * n - a
    return tuple(int(STOPS[a][k] + f * (STOPS[a + 1][k] - STOPS[a][k]) + 0.5) for k in range(3))
