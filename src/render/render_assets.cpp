// The pages' inline stylesheet and script. The script reads the JSON in #qkv-data and draws the
// selected head: an SVG heatmap for short inputs, a canvas beyond 48 tokens (a 512×512 heatmap
// as DOM nodes would be 262k elements); the top-k table; the comparison strips. Token text only
// ever reaches the DOM through textContent, never innerHTML. The SVG heatmap measures its labels
// and titles in the browser (getBBox) and sizes its margins from them, so no font guess can clip
// or overlap them. Colours follow data.scale: the weight itself (absolute) or weight / row max.
#include "render/render_util.h"

namespace qkv::detail {

const char* const kPageCss = R"css(
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1b1b1b;background:#fafafa}
header{background:#0c2c84;color:#fff;padding:12px 20px}header h1{margin:0;font-size:20px}
.source,.note{margin:4px 0;opacity:.9}main{padding:8px 20px 40px}
h2{font-size:17px;margin:20px 0 6px}h3{font-size:15px;margin:14px 0 4px}
.tokens{display:flex;flex-wrap:wrap;gap:4px;padding:0;list-style:none;margin:0;max-height:8.5em;overflow:auto}
.tokens li{background:#e8eefc;border:1px solid #c5d2f0;border-radius:4px;padding:1px 6px;cursor:pointer;white-space:pre}
.tokens li.q{background:#d7301f;color:#fff}
.controls{position:sticky;top:0;background:#fafafa;padding:8px 0;z-index:2;border-bottom:1px solid #ddd}
.controls label{margin-right:16px}select,input{font:inherit}
.heatmap-scroll{overflow:auto;max-height:80vh;max-width:100%;border:1px solid #ddd;background:#fff;position:relative}
.hm-wrap{position:relative;display:inline-block}
div#row-highlight{position:absolute;pointer-events:none;outline:2px solid #d7301f}
div#focus-box{position:absolute;pointer-events:none;outline:2px dashed #000}
.hm-panel{display:block;width:max-content;max-width:100%}.hm-caption{margin:4px 0;font-size:13px;max-width:60em}
#close-up{margin-top:8px;overflow:auto}
.readout{font-family:ui-monospace,monospace;min-height:1.5em}
#legend{display:flex;align-items:flex-start;gap:10px;margin:6px 0;flex-wrap:wrap}
.legend-scale{position:relative;display:inline-block;padding:0 16px 20px}.bar{display:block;width:240px;height:12px;border:1px solid #888}
.legend-scale .tick{position:absolute;top:15px;transform:translateX(-50%);font-size:11px;white-space:nowrap}
.note.oov{background:#fff3cd;color:#5c4400;border-radius:4px;padding:4px 8px;opacity:1}
.formula{font-family:ui-monospace,monospace;white-space:pre-wrap}.term{padding:0 2px;border-radius:3px}
table{border-collapse:collapse;font-family:ui-monospace,monospace;font-size:12px}
td,th{border:1px solid #ddd;padding:1px 5px;text-align:right;white-space:pre}th{background:#f0f0f0}
figure.matrix{margin:10px 0}figcaption{margin-bottom:3px}.clip{color:#a33}
.scroll{overflow:auto;max-width:100%}.scroll.tall{max-height:70vh}
tr.sel th,tr.sel td:first-child{outline:2px solid #d7301f}td.entry{text-align:left}
.sides{display:flex;gap:24px;flex-wrap:wrap}.side{flex:1 1 420px;min-width:0}
.strip{display:flex;flex-wrap:wrap;gap:3px}.chip{border:1px solid #ccc;border-radius:4px;padding:2px 5px;white-space:pre}
.chip.word{outline:2px solid #d7301f}.chip small{display:block;font-size:10px}
)css";

const char* const kPageJs = R"js(
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('qkv-data').textContent);
  var P = data.precision, tokens = data.tokens || [], SVGNS = 'http://www.w3.org/2000/svg';
  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, text, ns) {
    var e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fix(x) { return x.toFixed(P); }
  function rgb(t) {
    var s = data.colour_stops, n = s.length - 1;
    t = Math.max(0, Math.min(1, t || 0));
    var a = Math.min(Math.floor(t * n), n - 1), f = t * n - a, c = [];
    for (var k = 0; k < 3; k++) c.push(Math.round(s[a][k] + f * (s[a + 1][k] - s[a][k])));
    return 'rgb(' + c.join(',') + ')';
  }
  function ink(t) { return t > 0.55 ? '#fff' : '#000'; }
  var ROW = data.scale === 'row';
  function rowMax(row) { return Math.max.apply(null, row); }
  // Where weight w of a row whose largest weight is `largest` falls on the colour scale (0 to 1).
  function shade(w, largest) { return ROW ? (largest > 0 ? w / largest : 0) : w; }
  // The colour scale's legend; `largest` (the weights' maximum, when known) warns of a pale map.
  function legend(largest) {
    var box = $('legend'), stops = [];
    box.textContent = '';
    box.setAttribute('data-scale', data.scale);
    for (var s = 0; s <= 10; s++) stops.push(rgb(s / 10));
    box.appendChild(el('span', {'class': 'legend-title'},
                       ROW ? 'Colour: each weight ÷ the largest weight of its row' : 'Colour: the attention weight (absolute)'));
    var scale = el('span', {'class': 'legend-scale'});
    scale.appendChild(el('span', {'class': 'bar', style: 'background:linear-gradient(to right,' + stops.join(',') + ')'}));
    [0, 0.25, 0.5, 0.75, 1].forEach(function (t) {
      var text = ROW ? (t === 1 ? 'row max' : t === 0 ? '0' : Math.round(t * 100) + '%') : String(t);
      scale.appendChild(el('span', {'class': 'tick', style: 'left:' + (16 + 240 * t) + 'px'}, text));
    });
    box.appendChild(scale);
    box.appendChild(el('span', {id: 'legend-max', 'data-max': ROW ? 'row' : '1'},
                       ROW ? 'rows are not comparable by colour' : '0 = light, 1 = dark, on every row and head'));
    if (!ROW && largest !== undefined && largest < 0.2)
      box.appendChild(el('span', {id: 'legend-pale'}, 'The largest weight here is ' + fix(largest) +
                         ', so every cell is pale: the row scale (--color-scale row) colours each row from 0 to its largest.'));
  }
  // The characters a reader sees (an emoji, a letter with its accents) where the browser can tell,
  // else code points, which at least never split an emoji's surrogate pair.
  var graphemes = typeof Intl === 'object' && Intl.Segmenter ? new Intl.Segmenter(undefined, {granularity: 'grapheme'}) : null;
  function cut(t) {
    var c = graphemes ? Array.from(graphemes.segment(t), function (g) { return g.segment; }) : Array.from(t);
    return c.length > 16 ? c.slice(0, 15).join('') + '\u2026' : t;
  }
  // A word shown beside other text sits in its own bidi isolate, so that a right-to-left word, or
  // one holding a direction override such as U+202E, cannot reorder the numbers and words around
  // it. An isolate's end (U+2069) in the word without its start would close that isolate early,
  // and a start without its end would hold it open: the first is dropped, the second closed.
  function balanced(t) {
    var open = 0, out = '';
    Array.from(t).forEach(function (c) {
      if (c === '\u2069' && open === 0) return;
      if (c === '\u2066' || c === '\u2067' || c === '\u2068') open++;
      else if (c === '\u2069') open--;
      out += c;
    });
    return out + '\u2069'.repeat(open);
  }
  function bdi(t) { return el('bdi', {}, balanced(t)); }
  // The same isolate in plain text (tooltips): first-strong isolate … pop directional isolate.
  function isolated(t) { return '\u2068' + balanced(t) + '\u2069'; }
  // `box` holds `parts` (text, and elements such as bdi(word)) and nothing else.
  function fill(box, parts) {
    box.textContent = '';
    parts.forEach(function (p) { box.appendChild(typeof p === 'string' ? document.createTextNode(p) : p); });
    return box;
  }
  function readout(parts, i, j, w) {
    var r = fill($('readout'), parts);
    r.setAttribute('data-i', i); r.setAttribute('data-j', j); r.setAttribute('data-w', String(w));
    // As a tooltip: the words' isolates as characters.
    return parts.map(function (p) { return typeof p === 'string' ? p : isolated(p.textContent); }).join('');
  }
  // A weighted sum "0.2000·i + 0.1000·am + …", the largest `limit` terms in sentence order.
  function formula(box, name, row, toks, limit) {
    var order = row.map(function (w, j) { return j; });
    order.sort(function (a, b) { return row[b] - row[a] || a - b; });
    var shown = order.slice(0, limit).sort(function (a, b) { return a - b; }), largest = rowMax(row);
    fill(box, ['context(\u201c', bdi(name), '\u201d) = ']);
    shown.forEach(function (j, n) {
      if (n) box.appendChild(document.createTextNode(' + '));
      var t = shade(row[j], largest);
      box.appendChild(fill(el('span', {'class': 'term', 'data-j': j, 'data-w': String(row[j]), title: String(row[j]),
                                       style: 'background:' + rgb(t) + ';color:' + ink(t)}), [fix(row[j]) + '\u00b7', bdi(toks[j])]));
    });
    if (shown.length < row.length) {
      var rest = 0;
      order.slice(limit).forEach(function (j) { rest += row[j]; });
      box.appendChild(document.createTextNode(' + \u2026 (' + (row.length - shown.length) +
                                              ' smaller terms, total weight ' + fix(rest) + ')'));
    }
  }
  function vec(v) {
    var s = v.slice(0, 16).map(fix).join(', ');
    return '[' + s + (v.length > 16 ? ', \u2026 (' + v.length + ' values)' : '') + ']';
  }

  var AXIS_KEYS = 'keys (columns): the tokens attended to', AXIS_QUERIES = 'queries (rows): the tokens attending';
  var CLOSE = data.close_up;  // a long input's close-up: this many rows and keys around the chosen cell
  // A labelled heatmap of head h's `rows` × `cols` (token indices) as a new <svg id=id> in
  // `parent`; `numbered` puts each token's position before it (a close-up is out of context).
  // Key labels read across when each fits its column, else upright; the margins are what the
  // labels and titles measure (getBBox), and the titles are centred on the grid unless that would
  // push them off the picture (a 2-token grid is narrower than its titles).
  function drawGrid(parent, h, rows, cols, id, numbered) {
    var W = data.heads[h].weights, n = Math.max(rows.length, cols.length);
    var font = n <= 12 ? 12 : n <= 24 ? 11 : 10, pad = 6, line = Math.ceil(font * 1.4);
    var cell = n <= 12 ? 44 : Math.max(Math.ceil(font * 1.6), Math.floor(640 / n));
    var s = el('svg', {id: id, 'font-size': font, 'font-family': 'sans-serif'}, undefined, SVGNS);
    parent.appendChild(s);  // in the document first, so that its labels can be measured
    function label(cls, text, bold) {
      var t = el('text', {'class': cls}, text, SVGNS);
      if (bold) t.setAttribute('font-weight', 'bold');
      s.appendChild(t);
      return t;
    }
    function wide(t) { return t.getBBox().width; }
    function name(k) { return numbered ? (k + 1) + ' ' + cut(tokens[k]) : cut(tokens[k]); }
    var keyTitle = label('axis-title', AXIS_KEYS, true), queryTitle = label('axis-title', AXIS_QUERIES, true);
    var keys = cols.map(function (k) { return label('key', name(k)); });
    var queries = rows.map(function (k) { return label('query', name(k)); });
    var kw = Math.max.apply(null, keys.map(wide)), qw = Math.max.apply(null, queries.map(wide));
    var tk = wide(keyTitle), tq = wide(queryTitle);
    var across = kw <= cell - 6, band = across ? line : kw + 6, gw = cols.length * cell, gh = rows.length * cell;
    var left = pad + line + 6 + qw + 6, top = pad + line + 4 + band + 4;
    var cx = Math.max(left + gw / 2, pad + tk / 2), cy = Math.max(top + gh / 2, pad + line + 4 + tq / 2);
    s.setAttribute('width', Math.ceil(Math.max(left + gw, cx + tk / 2) + pad));
    s.setAttribute('height', Math.ceil(Math.max(top + gh, cy + tq / 2) + pad));
    keyTitle.setAttribute('x', cx); keyTitle.setAttribute('y', pad + font); keyTitle.setAttribute('text-anchor', 'middle');
    queryTitle.setAttribute('transform', 'translate(' + (pad + font) + ',' + cy + ') rotate(-90)');
    queryTitle.setAttribute('text-anchor', 'middle');
    keys.forEach(function (t, b) {
      if (across) {
        t.setAttribute('x', left + (b + 0.5) * cell); t.setAttribute('y', top - 6); t.setAttribute('text-anchor', 'middle');
      } else {
        t.setAttribute('transform', 'translate(' + (left + (b + 0.5) * cell + font * 0.35) + ',' + (top - 6) + ') rotate(-90)');
      }
    });
    queries.forEach(function (t, a) {
      t.setAttribute('x', left - 6); t.setAttribute('y', top + (a + 0.5) * cell + font * 0.35); t.setAttribute('text-anchor', 'end');
    });
    rows.forEach(function (i, a) {
      var largest = rowMax(W[i]);
      cols.forEach(function (j, b) {
        var w = W[i][j], t = shade(w, largest);
        var r = el('rect', {'class': 'cell', x: left + b * cell, y: top + a * cell, width: cell, height: cell, fill: rgb(t),
                            'data-i': i, 'data-j': j, 'data-w': String(w)}, undefined, SVGNS);
        r.appendChild(el('title', {}, '\u201c' + isolated(tokens[i]) + '\u201d \u2192 \u201c' + isolated(tokens[j]) + '\u201d: ' + String(w), SVGNS));
        s.appendChild(r);
        if (cell >= 30)
          s.appendChild(el('text', {x: left + (b + 0.5) * cell, y: top + (a + 0.5) * cell + 4, 'text-anchor': 'middle',
                                    'font-size': 10, fill: ink(t), 'pointer-events': 'none'}, w.toFixed(2), SVGNS));
      });
    });
    return {svg: s, left: left, top: top, cell: cell, width: gw};
  }
  function range(a, b) { var r = []; for (var k = a; k < b; k++) r.push(k); return r; }

  function explainPage() {
    var N = tokens.length, st = {head: -1, row: 0, col: 0}, box = $('heatmap'), cell, left, top, grid;
    function frame(g, id, a) {
      g.svg.appendChild(el('rect', {id: id, x: g.left, y: g.top + a * g.cell, width: g.width, height: g.cell, fill: 'none',
                                    stroke: '#d7301f', 'stroke-width': 3, 'pointer-events': 'none'}, undefined, SVGNS));
    }
    function listen(s) {
      s.addEventListener('mouseover', function (e) {
        var c = e.target;
        if (c.classList.contains('cell')) hover(+c.getAttribute('data-i'), +c.getAttribute('data-j'));
      });
      s.addEventListener('click', function (e) {
        var c = e.target;
        if (c.classList.contains('cell')) select(st.head, +c.getAttribute('data-i'), +c.getAttribute('data-j'));
      });
    }
    function drawSvg(h) {
      grid = drawGrid(box, h, range(0, N), range(0, N), 'heatmap-svg', false);
      cell = grid.cell; left = grid.left; top = grid.top;
      frame(grid, 'row-highlight', 0);
      listen(grid.svg);
      legend(data.heads[h].weights.reduce(function (m, row) { return Math.max(m, rowMax(row)); }, 0));
    }
    // Beyond 48 tokens: an overview of every weight (a canvas, 2 to 12 pixels a cell, in the
    // scrolling box) and a labelled close-up of the 24 rows and keys around the chosen cell.
    function drawCanvas(h) {
      var W = data.heads[h].weights;
      cell = Math.max(2, Math.min(12, Math.floor(900 / N))); left = 0; top = 0;
      var panel = el('div', {'class': 'hm-panel'});
      panel.appendChild(el('p', {'class': 'hm-caption'}, 'Overview of all ' + N + ' \u00d7 ' + N + ' weights (' + cell +
                               ' pixels a cell): \u2192 ' + AXIS_KEYS + '; \u2193 ' + AXIS_QUERIES +
                               '. Click a cell for a labelled close-up of the ' + CLOSE + ' rows and keys around it.'));
      var wrap = el('div', {'class': 'hm-wrap'});
      var c = el('canvas', {id: 'heatmap-canvas', width: N * cell, height: N * cell, 'data-cell': cell});
      var g = c.getContext('2d');
      for (var i = 0; i < N; i++) {
        var largest = rowMax(W[i]);
        for (var j = 0; j < N; j++) { g.fillStyle = rgb(shade(W[i][j], largest)); g.fillRect(j * cell, i * cell, cell, cell); }
      }
      function at(e) {
        var b = c.getBoundingClientRect();
        return [Math.floor((e.clientY - b.top) / cell), Math.floor((e.clientX - b.left) / cell)];
      }
      c.addEventListener('mousemove', function (e) {
        var p = at(e);
        if (p[0] >= 0 && p[0] < N && p[1] >= 0 && p[1] < N) c.title = hover(p[0], p[1]);
      });
      c.addEventListener('click', function (e) {
        var p = at(e);
        if (p[0] >= 0 && p[0] < N && p[1] >= 0 && p[1] < N) select(st.head, p[0], p[1]);
      });
      wrap.appendChild(c);
      wrap.appendChild(el('div', {id: 'row-highlight'}));
      wrap.appendChild(el('div', {id: 'focus-box'}));
      panel.appendChild(wrap);
      box.appendChild(panel);
      // The close-up goes above the overview, so the labelled part is what a reader sees first.
      box.parentNode.insertBefore(el('div', {id: 'close-up', 'class': 'hm-panel'}), box);
      legend(W.reduce(function (m, row) { return Math.max(m, rowMax(row)); }, 0));
    }
    function drawCloseUp(h, i, j) {
      var r0 = Math.max(0, Math.min(N - CLOSE, i - CLOSE / 2)), c0 = Math.max(0, Math.min(N - CLOSE, j - CLOSE / 2));
      var close = $('close-up');
      close.textContent = '';
      close.appendChild(el('p', {'class': 'hm-caption'}, 'Close-up: rows ' + (r0 + 1) + '\u2013' + (r0 + CLOSE) + ' \u00d7 keys ' +
                                (c0 + 1) + '\u2013' + (c0 + CLOSE) + ' of ' + N + ' (each token after its position).'));
      var g = drawGrid(close, h, range(r0, r0 + CLOSE), range(c0, c0 + CLOSE), 'heatmap-close-up', true);
      frame(g, 'close-up-row', i - r0);
      listen(g.svg);
      var f = $('focus-box').style;
      f.left = (c0 * cell) + 'px'; f.top = (r0 * cell) + 'px'; f.width = (CLOSE * cell) + 'px'; f.height = (CLOSE * cell) + 'px';
    }
    function hover(i, j) {
      var w = data.heads[st.head].weights[i][j];
      return readout(['head ' + (st.head + 1) + ': \u201c', bdi(tokens[i]), '\u201d \u2192 \u201c', bdi(tokens[j]),
                      '\u201d = ' + fix(w) + '   (exact ' + String(w) + ')'], i, j, w);
    }
    function select(h, i, j) {
      var row = data.heads[h].weights[i];
      if (j === undefined) j = row.indexOf(rowMax(row));  // the close-up shows where the row attends most
      if (h !== st.head) {
        box.textContent = '';
        if ($('close-up')) $('close-up').remove();
        (N <= 48 ? drawSvg : drawCanvas)(h);
        document.querySelectorAll('.head-steps').forEach(function (s) { s.hidden = +s.getAttribute('data-head') !== h; });
      }
      st.head = h; st.row = i; st.col = j;
      if (N > 48) drawCloseUp(h, i, j);
      $('head-select').value = String(h); $('query-select').value = String(i);
      box.setAttribute('data-head', h); box.setAttribute('data-row', i);
      var hl = $('row-highlight');
      hl.setAttribute('data-row', i);
      if (N <= 48) {
        hl.setAttribute('y', top + i * cell);
        box.querySelectorAll('rect.cell.sel').forEach(function (r) { r.classList.remove('sel'); });
        box.querySelectorAll('rect.cell[data-i="' + i + '"]').forEach(function (r) { r.classList.add('sel'); });
      } else {
        hl.style.left = left + 'px'; hl.style.top = (top + i * cell) + 'px';
        hl.style.width = (N * cell) + 'px'; hl.style.height = cell + 'px';
        $('close-up').querySelectorAll('rect.cell[data-i="' + i + '"]').forEach(function (r) { r.classList.add('sel'); });
      }
      document.querySelectorAll('.tokens li').forEach(function (li) { li.classList.toggle('q', +li.getAttribute('data-i') === i); });
      var hd = data.heads[h], sum = $('sum');
      sum.textContent = '';
      var f = el('p', {'class': 'formula', id: 'formula'});
      formula(f, tokens[i], hd.weights[i], tokens, 12);
      sum.appendChild(f);
      sum.appendChild(el('p', {'class': 'formula'}, '= ' + vec(hd.context[i]) + '   (each term: weight \u00b7 the value vector V[j] of that token)'));
      sum.appendChild(terms(hd, i));
    }
    // The terms of the sum as a table: weight, V[j], weight·V[j], and their total, the context vector.
    function terms(hd, i) {
      var row = hd.weights[i], order = row.map(function (w, j) { return j; }), t = el('table', {id: 'terms'});
      var box = el('div', {'class': 'scroll'});  // wider than a phone: it scrolls, not the page
      box.appendChild(t);
      order.sort(function (a, b) { return row[b] - row[a] || a - b; });
      order = order.slice(0, 12).sort(function (a, b) { return a - b; });
      var dims = Math.min(8, hd.v[0].length), head = el('tr', {});
      ['key token', 'weight', 'V[j]', 'weight \u00b7 V[j]'].forEach(function (h) { head.appendChild(el('th', {}, h)); });
      t.appendChild(head);
      function cells(v) { return '[' + v.slice(0, dims).map(fix).join(', ') + (v.length > dims ? ', \u2026' : '') + ']'; }
      order.forEach(function (j) {
        var tr = el('tr', {'data-j': j});
        tr.appendChild(el('th', {}, 'token ' + (j + 1) + ': ' + cut(tokens[j])));
        tr.appendChild(el('td', {}, fix(row[j])));
        tr.appendChild(el('td', {}, cells(hd.v[j])));
        tr.appendChild(el('td', {}, cells(hd.v[j].map(function (x) { return row[j] * x; }))));
        t.appendChild(tr);
      });
      var total = el('tr', {});
      total.appendChild(el('th', {}, order.length < row.length ? 'sum of all ' + row.length + ' terms' : 'sum'));
      total.appendChild(el('td', {}, fix(row.reduce(function (a, b) { return a + b; }, 0))));
      total.appendChild(el('td', {}, ''));
      total.appendChild(el('td', {}, cells(hd.context[i])));
      t.appendChild(total);
      return box;
    }
    $('head-select').addEventListener('change', function (e) { select(+e.target.value, st.row); });
    $('query-select').addEventListener('change', function (e) { select(st.head, +e.target.value); });
    document.querySelectorAll('.tokens li').forEach(function (li) {
      li.addEventListener('click', function () { select(st.head, +li.getAttribute('data-i')); });
    });
    select(0, 0);
  }

  function topkPage() {
    var N = tokens.length, K = data.k, PAGE = 100, st = {head: 0, row: 0}, table = $('topk-table'), input = $('query-input');
    function render() {
      var h = st.head, start = Math.floor(st.row / PAGE) * PAGE, end = Math.min(N, start + PAGE);
      table.textContent = '';
      table.setAttribute('data-head', h); table.setAttribute('data-row', st.row);
      var head = el('tr', {}); head.appendChild(el('th', {}, 'query'));
      for (var r = 0; r < K; r++) head.appendChild(el('th', {}, '#' + (r + 1)));
      head.appendChild(el('th', {}, 'rest'));
      table.appendChild(head);
      for (var i = start; i < end; i++) {
        var tr = el('tr', {'data-row': i});
        if (i === st.row) { tr.className = 'sel'; tr.id = 'row-highlight'; }
        tr.appendChild(el('th', {}, 'token ' + (i + 1) + ': ' + cut(tokens[i])));
        var largest = rowMax(data.weight.slice((h * N + i) * K, (h * N + i + 1) * K));
        for (r = 0; r < K; r++) {
          var o = (h * N + i) * K + r, j = data.index[o], w = data.weight[o], t = shade(w, largest);
          tr.appendChild(fill(el('td', {'class': 'entry', 'data-j': j, 'data-w': String(w),
                                        title: 'token ' + (j + 1) + ' of ' + N + ': ' + String(w),
                                        style: 'background:' + rgb(t) + ';color:' + ink(t)}),
                              [bdi(cut(tokens[j])), ' (' + (j + 1) + ') ' + fix(w)]));
        }
        tr.appendChild(el('td', {'class': 'rest'}, fix(data.rest[h * N + i])));
        table.appendChild(tr);
      }
      $('page-label').textContent = 'tokens ' + (start + 1) + '\u2013' + end + ' of ' + N;
      fill($('query-token'), ['\u201c', bdi(tokens[st.row]), '\u201d']);
      input.value = String(st.row + 1); $('head-select').value = String(h);
      legend();
      var sel = $('row-highlight');
      if (sel && sel.scrollIntoView) sel.scrollIntoView({block: 'nearest'});
    }
    function go(h, i) { st.head = h; st.row = Math.max(0, Math.min(N - 1, i)); render(); }
    $('head-select').addEventListener('change', function (e) { go(+e.target.value, st.row); });
    input.addEventListener('change', function () { var v = parseInt(input.value, 10); go(st.head, isNaN(v) ? 0 : v - 1); });
    $('prev-page').addEventListener('click', function () { go(st.head, st.row - PAGE); });
    $('next-page').addEventListener('click', function () { go(st.head, st.row + PAGE); });
    go(0, 0);
  }

  function comparePage() {
    function render(h) {
      data.sentences.forEach(function (s, n) {
        var row = s.weights[h], strip = $('strip-' + n), largest = rowMax(row);
        strip.textContent = ''; strip.setAttribute('data-head', h);
        row.forEach(function (w, j) {
          var t = shade(w, largest), c = el('span', {'class': 'chip' + (j === s.position ? ' word' : ''), 'data-j': j,
                                            'data-w': String(w), title: String(w), style: 'background:' + rgb(t) + ';color:' + ink(t)}, s.tokens[j]);
          c.appendChild(el('small', {}, fix(w)));
          c.addEventListener('mouseover', function () {
            readout(['sentence ' + (n + 1) + ', head ' + (h + 1) + ': \u201c', bdi(data.word), '\u201d \u2192 \u201c', bdi(s.tokens[j]),
                     '\u201d = ' + String(w)], s.position, j, w);
          });
          strip.appendChild(c);
        });
        formula($('formula-' + n), data.word, row, s.tokens, 12);
      });
      legend(Math.max(rowMax(data.sentences[0].weights[h]), rowMax(data.sentences[1].weights[h])));
    }
    $('head-select').addEventListener('change', function (e) { render(+e.target.value); });
    render(0);
  }

  if (data.kind === 'explain') explainPage();
  else if (data.kind === 'topk') topkPage();
  else if (data.kind === 'compare') comparePage();
})();
)js";

}  // namespace qkv::detail
