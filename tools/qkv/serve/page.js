// The qkv explorer: asks the server (POST /api/explain, /api/compare) and draws what it answers.
// Every number shown comes from the server, which computes it as `qkv explain --json` does.
'use strict';

const $ = (id) => document.getElementById(id);
const state = { config: null, mode: 'explain', waiting: false, query: 0, head: 0, cursor: null, data: null, seq: 0, compareSeq: 0 };
const DEBOUNCE_MS = 250;

// The colour of a weight in [0, 1]: a sequential blue scale (light = 0, dark = 1), also the legend.
const STOPS = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
function colour(w) {
  const t = Math.min(1, Math.max(0, w)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(t));
  const f = t - i;
  const c = STOPS[i].map((a, k) => Math.round(a + (STOPS[i + 1][k] - a) * f));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}
const fixed = (x, d) => (x === null || x === undefined ? '—' : Number(x).toFixed(d));

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'text') e.textContent = v;
    else if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}
const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
// The characters a reader sees (an emoji, a letter with its accents) where the browser can tell,
// else code points, which at least never split an emoji's surrogate pair.
const graphemes = typeof Intl === 'object' && Intl.Segmenter ? new Intl.Segmenter(undefined, { granularity: 'grapheme' }) : null;
const characters = (text) => (graphemes ? Array.from(graphemes.segment(text), (g) => g.segment) : Array.from(text));
// Long words are cut for labels; the full word is in the title.
function short(word, n) {
  const c = characters(word);
  return c.length > n ? c.slice(0, n - 1).join('') + '…' : word;
}

// A word shown beside other text sits in its own bidi isolate, so that a right-to-left word, or
// one holding a direction override such as U+202E, cannot reorder the numbers and words around
// it. An isolate's end (U+2069) in the word without its start would close that isolate early and
// let the rest out, and a start without its end would hold it open: the first is dropped (it
// shows nothing), the second closed.
function balanced(word) {
  let open = 0, out = '';
  for (const c of word) {
    if (c === '\u2069' && open === 0) continue;
    if (c === '\u2066' || c === '\u2067' || c === '\u2068') open++;
    else if (c === '\u2069') open--;
    out += c;
  }
  return out + '\u2069'.repeat(open);
}
const bdi = (word) => el('bdi', { text: balanced(word) });
// The same isolate in plain text (tooltips): first-strong isolate … pop directional isolate.
const isolated = (word) => `\u2068${balanced(word)}\u2069`;

function showError(message) {
  const box = $('error');
  box.textContent = message || '';
  box.hidden = !message;
}

// The words the server's --oov zero or skip changed in `which` ("the sentence"), named as the
// note of `qkv explain --html` names them: each distinct word once, in order, with how often it
// occurs. [] for no words, else [the note].
function missingNote(words, which) {
  if (words.length === 0) return [];
  const counts = new Map();
  for (const w of words) counts.set(w, (counts.get(w) || 0) + 1);
  const list = [];
  for (const [w, n] of counts) list.push(list.length > 0 ? ', “' : '“', bdi(w), n > 1 ? `” ×${n}` : '”');
  const s = words.length === 1 ? '' : 's';
  const what = state.config.oov === 'skip'
    ? `--oov skip left ${words.length} word${s} out of ${which}`
    : `--oov zero gave ${words.length} word${s} of ${which} ${words.length === 1 ? 'a zero vector' : 'zero vectors'}`;
  return [el('p', { class: 'caption note oov' }, `${what}, not being in the vocabulary: `, ...list,
             state.config.oov === 'skip' ? '. The page shows the tokens that remain.' : '.')];
}

// `seed` (digits, or null for none) joins the JSON as it is: see layerChoice.
async function post(path, body, seed = null) {
  const json = JSON.stringify(body);
  const text = seed === null ? json : `${json.slice(0, -1)},"seed":${seed}}`;
  const response = await fetch(path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: text });
  let answer = null;
  try { answer = await response.json(); } catch (e) { /* not JSON: reported below */ }
  if (!response.ok) throw new Error(answer && answer.error ? answer.error : `the server answered HTTP ${response.status}`);
  return answer;
}

// The layer, and the random layer's seed exactly as typed: the API takes any integer from 0 to
// 2^64 - 1, more than a JS number holds exactly (2^53), so the seed travels as its digits. Any
// other text throws a message rather than becoming some other seed (rounded, clamped, cut).
const SEED_LIMIT = 2n ** 64n;
function layerChoice() {
  const layer = document.querySelector('input[name=layer]:checked').value;
  const box = $('seed');
  const typed = box.value.trim();
  const whole = /^[0-9]+$/.test(typed) && BigInt(typed) < SEED_LIMIT;
  box.setAttribute('aria-invalid', String(layer === 'random' && !whole));
  if (layer !== 'random') return { layer, seed: null };
  if (!whole) throw new Error(`The seed must be a whole number from 0 to ${SEED_LIMIT - 1n} (2^64 − 1), not "${typed}".`);
  return { layer, seed: BigInt(typed).toString() };
}

// Runs f once typing pauses; state.waiting says an update is due (tests wait for it to clear).
function debounce(f) {
  let timer = null;
  return () => {
    clearTimeout(timer);
    state.waiting = true;
    timer = setTimeout(() => { state.waiting = false; f(); }, DEBOUNCE_MS);
  };
}

// ---- One sentence ------------------------------------------------------------------------------

// Only the newest request of a mode is drawn, and only while that mode is shown: the modes share
// #error, and a late answer of the mode left behind must not write into the other's.
async function explain() {
  const seq = ++state.seq;
  const wanted = () => seq === state.seq && state.mode === 'explain';
  $('explain-view').classList.add('stale');
  $('status').textContent = 'Computing…';
  try {
    const { layer, seed } = layerChoice();
    const body = { sentence: $('sentence').value, layer, scaled: $('scaled').checked,
                   positions: $('positions').checked, causal: $('causal').checked };
    const data = await post('/api/explain', body, seed);
    if (!wanted()) return;
    showError('');
    state.data = data;
    state.cursor = null;
    drawExplain();
    $('status').textContent = `${data.explanation.tokens.length} tokens · ${data.layer}` +
      `${data.options.scaled ? '' : ' · unscaled'}${data.options.positions ? ' · with positions' : ''}` +
      `${data.options.causal ? ' · causal' : ''}`;
    $('oov-note').replaceChildren(...missingNote(data.missing, 'the sentence'));
  } catch (e) {
    if (!wanted()) return;
    showError(e.message);
    $('status').textContent = 'Not updated: see the message above.';
  } finally {
    if (seq === state.seq) document.body.dataset.ready = String(seq);
  }
}

// A redraw replaces the token buttons, the head buttons and the heatmaps: the one that had the
// keyboard's focus hands it to its replacement, or focus would fall back to the page's start.
const REDRAWN = [['tokens', 'button'], ['head-picker', 'button'], ['heatmaps', 'svg']];
function focusedPlace() {
  for (const [id, kind] of REDRAWN) {
    const k = Array.from($(id).querySelectorAll(kind)).indexOf(document.activeElement);
    if (k >= 0) return { id, kind, k };
  }
  return null;
}
function refocus(place) {
  const all = place ? $(place.id).querySelectorAll(place.kind) : [];
  if (all.length > 0) all[Math.min(place.k, all.length - 1)].focus();
}

function drawExplain() {
  const e = state.data.explanation;
  const n = e.tokens.length;
  state.query = Math.min(state.query, n - 1);
  state.head = Math.min(state.head, e.heads.length - 1);
  $('explain-view').classList.remove('stale');
  const place = focusedPlace();
  drawTokens(e);
  drawHeatmaps(e);
  drawHeadPicker(e);
  refocus(place);
  drawBars(e);
  drawContext(e);
  const o = state.data.options;
  $('tokens-caption').textContent = 'Each word is looked up in the word vectors (a row of X' +
    (o.positions ? ', plus its position\'s sinusoidal encoding' : '') + '), then ' +
    (e.parameter_free ? 'used as it is: Q = K = V = X (no parameters).' : 'Q = X·W_q, K = X·W_k, V = X·W_v.') +
    ' Pick the word that asks (the query):';
  $('heatmap-caption').textContent = 'Row = the word asking (query), column = the word answering (key). ' +
    (o.scaled ? `Each row is softmax(Q·Kᵀ / √d_k), d_k = ${e.d_k}, and sums to 1. `
              : 'Unscaled: each row is softmax(Q·Kᵀ). Large scores push the softmax towards one word (saturation). ') +
    (o.causal ? 'Causal mask: a word sees only itself and the words before it (hatched cells are masked). ' : '') +
    'Hover a cell, or focus a heatmap and use the arrow keys, to read its numbers.';
}

function drawTokens(e) {
  const box = $('tokens');
  box.replaceChildren(...e.tokens.map((t, i) => el('button', {
    class: 'token', type: 'button', 'aria-pressed': String(i === state.query), title: `${isolated(t)} (token ${i + 1})`,
    'data-index': String(i), onclick: () => { state.query = i; state.cursor = null; drawExplain(); },
  }, bdi(short(t, 14)), el('span', { class: 'idx', text: String(i + 1) }))));
}

function setReadout(h, i, j) {
  const e = state.data.explanation;
  const head = e.heads[h];
  const masked = state.data.options.causal && j > i;
  $('readout').replaceChildren(`head ${h + 1}: "`, bdi(e.tokens[i]), `" (${i + 1}) → "`, bdi(e.tokens[j]), `" (${j + 1}): ` +
    `weight ${fixed(head.weights[i][j], 4)}${masked ? ' (masked)' : ''}, score ${fixed(head.scores[i][j], 4)}, ` +
    `scaled ${fixed(head.scaled_scores[i][j], 4)}`);
}

function drawHeatmaps(e) {
  const n = e.tokens.length;
  const box = $('heatmaps');
  const heads = e.heads.length;
  const perRow = Math.min(heads, n <= 16 ? 3 : 1);
  const avail = Math.max(240, (box.clientWidth || document.body.clientWidth - 40) / perRow - 16 * (perRow - 1));
  const chars = Math.min(14, Math.max(...e.tokens.map((t) => characters(t).length)));
  const label = Math.min(120, 12 + 7.5 * chars);
  // Column labels lean right (rotated -60°): room for the last one past the last column.
  const right = Math.ceil(0.5 * 0.62 * 13 * chars) + 4;
  const cell = Math.max(6, Math.min(48, Math.floor((avail - label - right) / n)));
  const font = Math.max(7, Math.min(13, cell * 0.75));
  const size = label + n * cell + right;
  const top = Math.min(120, 12 + 0.75 * font * chars);
  const maxChars = Math.max(3, Math.floor((label - 8) / (font * 0.6)));
  box.replaceChildren();
  e.heads.forEach((head, h) => {
    const s = svg('svg', { width: size + 2, height: top + n * cell + 2, viewBox: `0 0 ${size + 2} ${top + n * cell + 2}`,
                           role: 'img', tabindex: '0', 'aria-label': `attention weights of head ${h + 1}, ${n} by ${n}` });
    const defs = svg('defs');
    const hatch = svg('pattern', { id: `hatch-${h}`, width: 6, height: 6, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' });
    hatch.append(svg('rect', { width: 6, height: 6, fill: '#eeeeee' }), svg('line', { x1: 0, y1: 0, x2: 0, y2: 6, stroke: '#bbbbbb', 'stroke-width': 2 }));
    defs.append(hatch);
    s.append(defs);
    e.tokens.forEach((t, j) => {
      const x = label + j * cell + cell / 2;
      s.append(svg('text', { x, y: top - 4, 'font-size': font, transform: `rotate(-60 ${x} ${top - 4})`, class: 'col-label' }, short(t, Math.min(maxChars, chars))));
      s.append(svg('text', { x: label - 4, y: top + j * cell + cell / 2 + font / 3, 'font-size': font, 'text-anchor': 'end',
                             class: 'row-label', 'font-weight': j === state.query ? 700 : 400 }, short(t, maxChars)));
    });
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        const w = head.weights[i][j];
        const masked = state.data.options.causal && j > i;
        const r = svg('rect', { x: label + j * cell, y: top + i * cell, width: cell, height: cell, class: masked ? 'cell masked' : 'cell',
                                fill: masked ? `url(#hatch-${h})` : colour(w), 'data-i': i, 'data-j': j, 'data-w': String(w) });
        r.append(svg('title', {}, `${isolated(e.tokens[i])} → ${isolated(e.tokens[j])}: ${fixed(w, 4)}`));
        r.addEventListener('mouseenter', () => setReadout(h, i, j));
        r.addEventListener('click', () => { state.query = i; state.head = h; drawExplain(); setReadout(h, i, j); });
        s.append(r);
        if (cell >= 34 && !masked)
          s.append(svg('text', { x: label + j * cell + cell / 2, y: top + i * cell + cell / 2 + 4, 'font-size': 11, 'text-anchor': 'middle',
                                 fill: w > 0.5 ? '#ffffff' : '#1b1f24', 'pointer-events': 'none' }, fixed(w, 2)));
      }
    }
    s.append(svg('rect', { x: label, y: top + state.query * cell, width: n * cell, height: cell, fill: 'none', stroke: '#f0a020', 'stroke-width': 2, 'pointer-events': 'none' }));
    // Keyboard: the arrow keys move a cursor over the cells and read each one out.
    s.addEventListener('keydown', (ev) => {
      const c = state.cursor && state.cursor.h === h ? state.cursor : { h, i: state.query, j: 0 };
      const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
      if (ev.key === 'Enter' || ev.key === ' ') { state.query = c.i; drawExplain(); ev.preventDefault(); return; }
      if (!moves[ev.key]) return;
      ev.preventDefault();
      c.i = Math.min(n - 1, Math.max(0, c.i + moves[ev.key][0]));
      c.j = Math.min(n - 1, Math.max(0, c.j + moves[ev.key][1]));
      state.cursor = c;
      setReadout(h, c.i, c.j);
    });
    box.append(el('div', { class: 'heatmap' }, el('h3', { text: heads > 1 ? `Head ${h + 1}` : 'Attention weights' }), s));
  });
}

function drawHeadPicker(e) {
  const box = $('head-picker');
  if (e.heads.length === 1) { box.replaceChildren(); return; }
  box.replaceChildren(...e.heads.map((_, h) => el('button', {
    class: 'token', type: 'button', 'aria-pressed': String(h === state.head), text: `head ${h + 1}`,
    onclick: () => { state.head = h; drawExplain(); },
  })));
}

// One row of weights as bars: label, bar, value (4 decimals).
function barRows(tokens, row, { highlight = -1, maskedFrom = Infinity } = {}) {
  const grid = el('div', { class: 'bars', role: 'list' });
  tokens.forEach((t, j) => {
    const masked = j >= maskedFrom;
    grid.append(
      el('div', { class: masked ? 'label masked' : 'label', title: `${isolated(t)} (token ${j + 1})`, role: 'listitem',
                  style: j === highlight ? 'font-weight:700' : '' }, bdi(short(t, 16))),
      el('div', { class: 'track', title: `${isolated(t)}: ${fixed(row[j], 6)}` },
         el('div', { class: 'fill', style: `width:${(100 * row[j]).toFixed(2)}%` })),
      el('div', { class: masked ? 'value masked' : 'value', 'data-w': String(row[j]), text: masked ? '0 (masked)' : fixed(row[j], 4) }));
  });
  return grid;
}

function drawBars(e) {
  const i = state.query;
  $('bars-query').replaceChildren('"', bdi(e.tokens[i]), `" (token ${i + 1})` + (e.heads.length > 1 ? `, head ${state.head + 1}` : ''));
  const row = e.heads[state.head].weights[i];
  $('bars').replaceChildren(barRows(e.tokens, row, { highlight: i, maskedFrom: state.data.options.causal ? i + 1 : Infinity }));
}

// Step 5: the largest terms weight_j · v_j, their sum and the context vector, on the first columns.
function drawContext(e) {
  const h = e.heads[state.head];
  const i = state.query;
  const cols = Math.min(6, h.v[0].length);
  const order = e.tokens.map((_, j) => j);
  const shown = order.length > 10 ? order.slice().sort((a, b) => h.weights[i][b] - h.weights[i][a]).slice(0, 8).sort((a, b) => a - b) : order;
  const head = el('tr', {}, el('th', { text: 'word' }), el('th', { text: 'weight' }), el('th', { text: '×' }),
                  ...Array.from({ length: cols }, (_, d) => el('th', { text: `v[${d}]` })), el('th', { text: cols < h.v[0].length ? `… (${h.v[0].length} values)` : '' }));
  const rows = shown.map((j) => el('tr', {}, el('td', { text: e.tokens[j], title: `${isolated(e.tokens[j])} (token ${j + 1})` }),
    el('td', { text: fixed(h.weights[i][j], 4) }), el('td', { text: '×' }),
    ...Array.from({ length: cols }, (_, d) => el('td', { text: fixed(h.v[j][d], 4), title: String(h.v[j][d]) })), el('td')));
  if (shown.length < order.length)
    rows.push(el('tr', {}, el('td', { text: `… ${order.length - shown.length} smaller terms`, colspan: String(cols + 4) })));
  const total = el('tr', { class: 'total' }, el('td', {}, 'context of "', bdi(short(e.tokens[i], 14)), '"'), el('td', { text: 'Σ' }), el('td', { text: '=' }),
    ...Array.from({ length: cols }, (_, d) => el('td', { class: 'context-value', text: fixed(h.context[i][d], 4), 'data-v': String(h.context[i][d]), title: String(h.context[i][d]) })), el('td'));
  const table = el('table', { class: 'sum' }, el('thead', {}, head), el('tbody', {}, ...rows, total));
  $('context').replaceChildren(table);
  $('context-caption').replaceChildren('context("', bdi(e.tokens[i]), '") = Σ_j weight_j · v_j: each value row scaled by its ' +
    `weight (the bars above), then added up column by column. The first ${cols} of ${h.v[0].length} columns are shown.`);
}

// ---- One word in two sentences -----------------------------------------------------------------

async function compare() {
  const seq = ++state.compareSeq;
  const wanted = () => seq === state.compareSeq && state.mode === 'compare';
  $('compare-view').classList.add('stale');
  $('compare-status').textContent = 'Computing…';
  try {
    const { layer, seed } = layerChoice();
    const body = { word: $('word').value, sentences: [$('sentence1').value, $('sentence2').value], layer,
                   positions: $('positions').checked };
    const data = await post('/api/compare', body, seed);
    if (!wanted()) return;
    showError('');
    drawCompare(data);
    $('compare-view').classList.remove('stale');
    $('compare-status').textContent = `layer: ${data.layer}`;
  } catch (e) {
    if (!wanted()) return;
    showError(e.message);
    $('compare-status').textContent = 'Not updated: see the message above.';
  } finally {
    if (seq === state.compareSeq) document.body.dataset.compareReady = String(seq);
  }
}

function drawCompare(c) {
  $('cosine-values').replaceChildren(
    el('div', { class: 'cosine' }, el('div', {}, 'static cosine of "', bdi(c.word), '"'), el('div', { class: 'number', id: 'static-cosine', text: fixed(c.static_cosine, 4) })),
    el('div', { class: 'cosine' }, el('div', {}, 'contextual cosine of "', bdi(c.word), '"'), el('div', { class: 'number', id: 'contextual-cosine', text: fixed(c.contextual_cosine, 4) })));
  $('sides').replaceChildren(...c.sentences.map((s, n) => {
    const tokens = el('div', { class: 'token-row' }, ...s.tokens.map((t, j) => el('span', { class: j === s.position ? 'token word' : 'token', title: t, text: short(t, 14) })));
    const nearest = s.nearest.length === 0
      ? el('p', { class: 'caption', text: 'No nearest words: the layer\'s output width differs from the word vectors\'.' })
      : el('ol', { class: 'nearest' }, ...s.nearest.map((w) => el('li', {}, bdi(w.word), ' ', el('span', { class: 'cos', text: fixed(w.cosine, 4) }))));
    return el('div', { class: 'side' }, el('h3', {}, `Sentence ${n + 1}: "`, bdi(s.text), '"'), tokens,
      ...missingNote(s.missing, `sentence ${n + 1}`),
      el('p', { class: 'caption' }, 'What "', bdi(c.word), `" attends to (head 1${s.weights.length > 1 ? ` of ${s.weights.length}` : ''}):`),
      barRows(s.tokens, s.weights[0], { highlight: s.position }),
      el('p', { class: 'caption', text: `Words nearest its contextual vector (cosine):` }), nearest);
  }));
}

// ---- Wiring ------------------------------------------------------------------------------------

function update() { if (state.mode === 'explain') explain(); else compare(); }

function setMode(mode) {
  state.mode = mode;
  showError('');  // the message was the other mode's; this mode's answer brings its own
  for (const [m, tab] of [['explain', $('tab-explain')], ['compare', $('tab-compare')]]) {
    tab.setAttribute('aria-selected', String(m === mode));
    tab.tabIndex = m === mode ? 0 : -1;
    $(`${m}-view`).hidden = m !== mode;
  }
  // Compare runs the layer as `qkv compare` does: always scaled, never masked.
  for (const id of ['scaled', 'causal']) {
    $(id).disabled = mode === 'compare';
    $(id).parentElement.classList.toggle('disabled', mode === 'compare');
  }
  $('toggle-caption').textContent = mode === 'compare' ? 'Comparing runs the layer as it is: scaled, no mask.' : toggleCaption();
  update();
}

function toggleCaption() {
  return 'Positions: without them "the cat chased the dog" and "the dog chased the cat" give the same weights, ' +
    'only reordered. Causal: a decoder\'s word may not look ahead.';
}

async function start() {
  try {
    const response = await fetch('/api/config');
    state.config = await response.json();
    const c = state.config;
    $('vocab').replaceChildren('Word vectors: ', bdi(c.embeddings), ` (${c.vocabulary} words, width ${c.width}). ` +
      `Up to ${c.limits.max_tokens} words per sentence.`);
    $('label-default').textContent = `default: ${c.layers[0].label}`;
    $('positions').checked = c.positions;
    $('layer-caption').textContent = 'The default is the layer `qkv explain` uses with the same options; parameter-free uses each word\'s vector as its query, key and value.';
  } catch (e) {
    showError(`Cannot reach the qkv server: ${e.message}`);
    return;
  }
  $('toggle-caption').textContent = toggleCaption();
  const later = debounce(update);
  for (const id of ['sentence', 'word', 'sentence1', 'sentence2', 'seed']) $(id).addEventListener('input', later);
  for (const input of document.querySelectorAll('input[name=layer], #scaled, #positions, #causal')) input.addEventListener('change', update);
  $('tab-explain').addEventListener('click', () => setMode('explain'));
  $('tab-compare').addEventListener('click', () => setMode('compare'));
  $('modes').addEventListener('keydown', (ev) => {
    if (ev.key !== 'ArrowLeft' && ev.key !== 'ArrowRight') return;
    const next = state.mode === 'explain' ? 'compare' : 'explain';
    setMode(next);
    $(`tab-${next}`).focus();
  });
  let resize = null;
  window.addEventListener('resize', () => { clearTimeout(resize); resize = setTimeout(() => state.data && drawExplain(), 150); });
  explain();
}

// The legend: the colour scale from 0 to 1.
(function legend() {
  const ramp = el('canvas', { class: 'ramp', width: '240', height: '14' });
  const g = ramp.getContext('2d');
  for (let x = 0; x < 240; x++) { g.fillStyle = colour(x / 239); g.fillRect(x, 0, 1, 14); }
  $('legend').replaceChildren(el('span', { text: 'weight 0' }), ramp, el('span', { text: '1' }), el('span', { text: '(hatched: masked)' }));
})();
start();
