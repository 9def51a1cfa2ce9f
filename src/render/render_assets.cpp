// The pages' inline stylesheet and script. The script reads the JSON in #qkv-data and draws the
// selected head: an SVG heatmap for short inputs, a canvas beyond 48 tokens (a 512×512 heatmap
// as DOM nodes would be 262k elements); the top-k table; the comparison strips. Token text only
// ever reaches the DOM through textContent, never innerHTML.
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
.readout{font-family:ui-monospace,monospace;min-height:1.5em}
#legend{display:flex;align-items:center;gap:8px;margin:6px 0}.bar{width:240px;height:12px;border:1px solid #888}
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
  function rowMax(rows) {
    var m = 0;
    for (var i = 0; i < rows.length; i++) for (var j = 0; j < rows[i].length; j++) m = Math.max(m, rows[i][j]);
    return m;
  }
  function legend(vmax) {
    var box = $('legend'), stops = [];
    box.textContent = '';
    for (var s = 0; s <= 10; s++) stops.push(rgb(s / 10));
    box.appendChild(el('span', {}, 'weight 0'));
    box.appendChild(el('span', {'class': 'bar', style: 'background:linear-gradient(to right,' + stops.join(',') + ')'}));
    box.appendChild(el('span', {id: 'legend-max', 'data-max': String(vmax)}, fix(vmax) + ' (largest)'));
  }
  function cut(t) { return t.length > 16 ? t.slice(0, 15) + '\u2026' : t; }
  function readout(text, i, j, w) {
    var r = $('readout');
    r.textContent = text;
    r.setAttribute('data-i', i); r.setAttribute('data-j', j); r.setAttribute('data-w', String(w));
  }
  // A weighted sum "0.2000·i + 0.1000·am + …", the largest `limit` terms in sentence order.
  function formula(box, name, row, toks, limit) {
    var order = row.map(function (w, j) { return j; });
    order.sort(function (a, b) { return row[b] - row[a] || a - b; });
    var shown = order.slice(0, limit).sort(function (a, b) { return a - b; }), vmax = Math.max.apply(null, row);
    box.textContent = 'context(\u201c' + name + '\u201d) = ';
    shown.forEach(function (j, n) {
      if (n) box.appendChild(document.createTextNode(' + '));
      var t = row[j] / vmax;
      box.appendChild(el('span', {'class': 'term', 'data-j': j, 'data-w': String(row[j]), title: String(row[j]),
                                  style: 'background:' + rgb(t) + ';color:' + ink(t)}, fix(row[j]) + '\u00b7' + toks[j]));
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
  function explainPage() {
    var N = tokens.length, st = {head: -1, row: 0}, box = $('heatmap'), cell, left, top;
    var longest = Math.min(16, Math.max.apply(null, tokens.map(function (t) { return t.length; })));
    function drawSvg(h) {
      var W = data.heads[h].weights, vmax = rowMax(W);
      cell = N <= 12 ? 44 : Math.max(13, Math.floor(640 / N));
      left = 30 + 7 * longest; top = 46 + 5 * longest;
      var s = el('svg', {id: 'heatmap-svg', width: left + N * cell + 8, height: top + N * cell + 8, 'font-size': 11}, undefined, SVGNS);
      s.appendChild(el('text', {'class': 'axis-title', x: left + N * cell / 2, y: 14, 'text-anchor': 'middle', 'font-weight': 'bold'},
                       AXIS_KEYS, SVGNS));
      s.appendChild(el('text', {'class': 'axis-title', transform: 'translate(14,' + (top + N * cell / 2) + ') rotate(-90)',
                                'text-anchor': 'middle', 'font-weight': 'bold'}, AXIS_QUERIES, SVGNS));
      for (var j = 0; j < N; j++)
        s.appendChild(el('text', {'class': 'key', transform: 'translate(' + (left + (j + 0.6) * cell) + ',' + (top - 4) + ') rotate(-60)'}, cut(tokens[j]), SVGNS));
      for (var i = 0; i < N; i++) {
        s.appendChild(el('text', {'class': 'query', x: left - 4, y: top + (i + 0.5) * cell + 4, 'text-anchor': 'end'}, cut(tokens[i]), SVGNS));
        for (j = 0; j < N; j++) {
          var w = W[i][j], t = w / vmax;
          var r = el('rect', {'class': 'cell', x: left + j * cell, y: top + i * cell, width: cell, height: cell, fill: rgb(t),
                              'data-i': i, 'data-j': j, 'data-w': String(w)}, undefined, SVGNS);
          r.appendChild(el('title', {}, '\u201c' + tokens[i] + '\u201d \u2192 \u201c' + tokens[j] + '\u201d: ' + String(w), SVGNS));
          s.appendChild(r);
          if (cell >= 30)
            s.appendChild(el('text', {x: left + (j + 0.5) * cell, y: top + (i + 0.5) * cell + 4, 'text-anchor': 'middle',
                                      'font-size': 10, fill: ink(t), 'pointer-events': 'none'}, w.toFixed(2), SVGNS));
        }
      }
      s.appendChild(el('rect', {id: 'row-highlight', x: left, width: N * cell, height: cell, fill: 'none',
                                stroke: '#d7301f', 'stroke-width': 3, 'pointer-events': 'none'}, undefined, SVGNS));
      s.addEventListener('mouseover', function (e) {
        var c = e.target;
        if (c.classList.contains('cell')) hover(+c.getAttribute('data-i'), +c.getAttribute('data-j'));
      });
      s.addEventListener('click', function (e) {
        if (e.target.classList.contains('cell')) select(st.head, +e.target.getAttribute('data-i'));
      });
      box.appendChild(s);
      legend(vmax);
    }
    function drawCanvas(h) {
      var W = data.heads[h].weights, vmax = rowMax(W);
      cell = Math.max(2, Math.min(12, Math.floor(900 / N)));
      var labels = cell >= 9;
      left = labels ? 30 + 7 * longest : 0; top = labels ? 46 + 5 * longest : 0;
      var wrap = el('div', {'class': 'hm-wrap'});
      var c = el('canvas', {id: 'heatmap-canvas', width: left + N * cell, height: top + N * cell});
      var g = c.getContext('2d');
      g.fillStyle = '#fff'; g.fillRect(0, 0, c.width, c.height);
      for (var i = 0; i < N; i++)
        for (var j = 0; j < N; j++) { g.fillStyle = rgb(W[i][j] / vmax); g.fillRect(left + j * cell, top + i * cell, cell, cell); }
      if (labels) {
        g.fillStyle = '#000'; g.font = 'bold 11px sans-serif'; g.textAlign = 'center';
        g.fillText(AXIS_KEYS, left + N * cell / 2, 14);
        g.save(); g.translate(14, top + N * cell / 2); g.rotate(-Math.PI / 2); g.fillText(AXIS_QUERIES, 0, 0); g.restore();
        g.font = '10px sans-serif'; g.textAlign = 'right';
        for (i = 0; i < N; i++) g.fillText(cut(tokens[i]), left - 3, top + (i + 0.5) * cell + 3);
        for (j = 0; j < N; j++) {
          g.save(); g.translate(left + (j + 0.6) * cell, top - 3); g.rotate(-Math.PI / 3);
          g.textAlign = 'left'; g.fillText(cut(tokens[j]), 0, 0); g.restore();
        }
      }
      function at(e) {
        var b = c.getBoundingClientRect();
        return [Math.floor((e.clientY - b.top - top) / cell), Math.floor((e.clientX - b.left - left) / cell)];
      }
      c.addEventListener('mousemove', function (e) {
        var p = at(e);
        if (p[0] >= 0 && p[0] < N && p[1] >= 0 && p[1] < N) { hover(p[0], p[1]); c.title = $('readout').textContent; }
      });
      c.addEventListener('click', function (e) { var p = at(e); if (p[0] >= 0 && p[0] < N) select(st.head, p[0]); });
      wrap.appendChild(c);
      wrap.appendChild(el('div', {id: 'row-highlight'}));
      box.appendChild(wrap);
      legend(vmax);
    }
    function hover(i, j) {
      var w = data.heads[st.head].weights[i][j];
      readout('head ' + (st.head + 1) + ': \u201c' + tokens[i] + '\u201d \u2192 \u201c' + tokens[j] + '\u201d = ' + fix(w) +
              '   (exact ' + String(w) + ')', i, j, w);
    }
    function select(h, i) {
      if (h !== st.head) {
        box.textContent = '';
        (N <= 48 ? drawSvg : drawCanvas)(h);
        document.querySelectorAll('.head-steps').forEach(function (s) { s.hidden = +s.getAttribute('data-head') !== h; });
      }
      st.head = h; st.row = i;
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
      return t;
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
    function headMax(h) {  // the colour scale: this head's largest listed weight
      var m = 0;
      for (var o = h * N * K; o < (h + 1) * N * K; o++) m = Math.max(m, data.weight[o]);
      return m || 1;
    }
    function render() {
      var h = st.head, start = Math.floor(st.row / PAGE) * PAGE, end = Math.min(N, start + PAGE), vmax = headMax(h);
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
        for (r = 0; r < K; r++) {
          var o = (h * N + i) * K + r, j = data.index[o], w = data.weight[o];
          tr.appendChild(el('td', {'class': 'entry', 'data-j': j, 'data-w': String(w),
                                   title: 'token ' + (j + 1) + ' of ' + N + ': ' + String(w),
                                   style: 'background:' + rgb(w / vmax) + ';color:' + ink(w / vmax)},
                            cut(tokens[j]) + ' (' + (j + 1) + ') ' + fix(w)));
        }
        tr.appendChild(el('td', {'class': 'rest'}, fix(data.rest[h * N + i])));
        table.appendChild(tr);
      }
      $('page-label').textContent = 'tokens ' + (start + 1) + '\u2013' + end + ' of ' + N;
      $('query-token').textContent = '\u201c' + tokens[st.row] + '\u201d';
      input.value = String(st.row + 1); $('head-select').value = String(h);
      legend(vmax);
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
      var vmax = Math.max(rowMax([data.sentences[0].weights[h]]), rowMax([data.sentences[1].weights[h]]));
      data.sentences.forEach(function (s, n) {
        var row = s.weights[h], strip = $('strip-' + n);
        strip.textContent = ''; strip.setAttribute('data-head', h);
        row.forEach(function (w, j) {
          var t = w / vmax, c = el('span', {'class': 'chip' + (j === s.position ? ' word' : ''), 'data-j': j,
                                            'data-w': String(w), title: String(w), style: 'background:' + rgb(t) + ';color:' + ink(t)}, s.tokens[j]);
          c.appendChild(el('small', {}, fix(w)));
          c.addEventListener('mouseover', function () {
            readout('sentence ' + (n + 1) + ', head ' + (h + 1) + ': \u201c' + data.word + '\u201d \u2192 \u201c' + s.tokens[j] +
                    '\u201d = ' + String(w), s.position, j, w);
          });
          strip.appendChild(c);
        });
        formula($('formula-' + n), data.word, row, s.tokens, 12);
      });
      legend(vmax);
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
