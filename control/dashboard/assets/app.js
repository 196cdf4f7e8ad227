// The meridian dashboard: polls the control server's /debug/state once a second, draws
// the current weights and engine state, and keeps a short history in the page for the
// charts. Every field but nodes[*].models[*].weights and engines[*].name may be absent
// (the control server omits what it does not know yet): absent values draw as "–".
'use strict';

const POLL_MS = 1000;
const HISTORY_MS = 5 * 60 * 1000;
const STATE_URL = new URL('../debug/state', location.href);
const COLORS = ['#1f6feb', '#d1242f', '#2da44e', '#bf8700', '#8250df', '#0a7f8c', '#cf5f00', '#57606a',
  '#e85aad', '#116329', '#953800', '#0550ae'];

const history = []; // {t, engines: {name: {load, ttft, penalty}}, shed: {node: fraction}}
let model = null;

const $ = (id) => document.getElementById(id);
const num = (v) => (typeof v === 'number' && isFinite(v) ? v : null);
// pct keeps small shares visible: 0.5% rather than 0%.
const pct = (f) => (f * 100).toFixed(f < 0.1 ? 1 : 0) + '%';
const fmt = (v, digits = 1) => (num(v) === null ? '–' : v.toFixed(digits));

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

async function poll() {
  try {
    const r = await fetch(STATE_URL, { cache: 'no-store' });
    if (!r.ok) throw new Error('status ' + r.status);
    const st = await r.json();
    record(st);
    render(st);
    setStatus(true, 'live');
  } catch (err) {
    setStatus(false, 'no state: ' + err.message);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function setStatus(up, text) {
  const s = $('status');
  s.className = 'status ' + (up ? 'up' : 'down');
  s.textContent = text;
}

// record adds one state document to the charts' history, at its own time when it has one.
function record(st, t = Date.now()) {
  const sample = { t, engines: {}, shed: {} };
  for (const e of st.engines || []) {
    sample.engines[e.name] = { load: num(e.load_rps), ttft: num(e.ttft_p50_ms), penalty: num(e.penalty) };
  }
  for (const [node, ns] of Object.entries(st.nodes || {})) {
    const m = (ns.models || {})[currentModel(st)];
    if (m) sample.shed[node] = num(m.shed_fraction);
  }
  history.push(sample);
  while (history.length && history[0].t < Date.now() - HISTORY_MS) history.shift();
}

// loadHistory seeds the charts with what the server recorded before the page opened
// (history.json; absent when the server keeps no history).
async function loadHistory() {
  try {
    const r = await fetch(new URL('history.json', location.href), { cache: 'no-store' });
    if (!r.ok) return;
    for (const st of await r.json()) record(st, Date.parse(st.updated_at) || Date.now());
  } catch (err) {
    // No history: the charts start now.
  }
}

function currentModel(st) {
  const models = st.models || [];
  if (!models.includes(model)) model = st.default_model || models[0] || null;
  return model;
}

function render(st) {
  const m = currentModel(st);
  $('version').textContent = 'snapshot ' + (st.version || '–');
  $('updated').textContent = st.updated_at ? 'at ' + new Date(st.updated_at).toLocaleTimeString() : '';
  const sv = st.solver;
  $('solver').textContent = !sv ? 'solver: not reported (static weights)'
    : `solver ${fmt(sv.solve_ms, 1)} ms, objective ${fmt(sv.objective, 2)}` +
      (num(sv.mean_latency_ms) !== null ? `, mean latency ${fmt(sv.mean_latency_ms, 0)} ms` : '') +
      (sv.error ? ` — last solve failed: ${sv.error} (weights are the last good ones)` : '');
  renderModelPicker(st.models || []);
  renderMatrix(st, m);
  renderNodes(st, m);
  renderEngines(st);
  renderCharts(st);
  $('window').textContent = Math.round(HISTORY_MS / 60000) + ' minutes';
  document.body.dataset.version = st.version || '';
}

function renderModelPicker(models) {
  const pick = $('model-pick');
  pick.hidden = models.length < 2;
  const sel = $('model');
  if (sel.options.length !== models.length) {
    sel.replaceChildren(...models.map((x) => el('option', { value: x }, x)));
    sel.onchange = () => { model = sel.value; };
  }
  sel.value = model;
}

// enginesByRegion groups engine names by region, keeping the server's order.
function enginesByRegion(st) {
  const groups = new Map();
  for (const e of st.engines || []) {
    const r = e.region || '?';
    if (!groups.has(r)) groups.set(r, []);
    groups.get(r).push(e);
  }
  return groups;
}

function renderMatrix(st, m) {
  const groups = enginesByRegion(st);
  const head1 = el('tr', {}, el('th'));
  const head2 = el('tr', {}, el('th', {}, 'cluster \\ engine'));
  for (const [region, es] of groups) {
    head1.append(el('th', { class: 'region', colSpan: es.length }, 'region ' + region));
    for (const e of es) head2.append(el('th', {}, e.name));
  }
  const rows = [head1, head2];
  for (const node of Object.keys(st.nodes || {}).sort()) {
    const weights = ((st.nodes[node].models || {})[m] || {}).weights || {};
    const total = Object.values(weights).reduce((a, b) => a + b, 0);
    const tr = el('tr', {}, el('td', { class: 'rowname' }, node, el('br'), el('small', { class: 'meta' }, 'region ' + (st.nodes[node].region || '?'))));
    for (const es of groups.values()) {
      for (const e of es) tr.append(cell(node, e.name, weights[e.name] || 0, total));
    }
    rows.push(tr);
  }
  const table = el('table', {}, ...rows);
  $('matrix').replaceChildren(rows.length > 2 ? table : el('p', { class: 'empty' }, 'no data-plane clusters'));
}

function cell(node, engine, w, total) {
  const attrs = { 'data-node': node, 'data-engine': engine, 'data-weight': String(w), class: 'cell' };
  if (!w) {
    attrs.class += ' off';
    attrs.title = `${node} sends nothing to ${engine}`;
    return el('td', attrs, el('span', { class: 'share' }, '0'), el('span', { class: 'w' }, 'not in EDS'));
  }
  const share = total ? w / total : 0;
  // Perceptual ramp: white to deep blue; text turns white on dark cells.
  const light = 97 - share * 62;
  attrs.style = `background: hsl(214, 85%, ${light}%); color: ${light < 62 ? '#fff' : 'inherit'}`;
  attrs.title = `${node} → ${engine}: weight ${w} of ${total} (${(share * 100).toFixed(1)}%)`;
  return el('td', attrs, el('span', { class: 'share' }, pct(share)), el('span', { class: 'w' }, 'w ' + w));
}

// retryState finds retry-budget fields wherever the server puts them (node, model or
// top level) and prints them compactly.
function retryState(...objs) {
  const parts = [];
  for (const o of objs) {
    for (const [k, v] of Object.entries(o || {})) {
      if (!/retry/i.test(k)) continue;
      parts.push(typeof v === 'object' && v !== null
        ? Object.entries(v).map(([kk, vv]) => `${kk} ${typeof vv === 'number' ? +vv.toFixed(3) : vv}`).join(', ')
        : `${k} ${v}`);
    }
  }
  return parts.join('; ') || '–';
}

function renderNodes(st, m) {
  const rows = [el('tr', {}, ...['cluster', 'region', 'demand (req/s)', 'shed fraction', 'retry budget'].map((h) => el('th', {}, h)))];
  for (const node of Object.keys(st.nodes || {}).sort()) {
    const ns = st.nodes[node];
    const ms = (ns.models || {})[m] || {};
    const shed = num(ms.shed_fraction);
    rows.push(el('tr', { 'data-node': node },
      el('td', {}, node), el('td', {}, ns.region || '–'),
      el('td', { class: 'num' }, fmt(ms.demand_rps, 1)),
      el('td', { class: 'num', 'data-shed': shed === null ? '' : String(shed) }, shed === null ? '–' : (shed * 100).toFixed(1) + '%'),
      el('td', {}, retryState(ms, ns, st))));
  }
  $('nodes').replaceChildren(...rows);
}

function renderEngines(st) {
  const heads = ['engine', 'region', 'capacity (req/s)', 'load (req/s)', 'utilization', 'TTFT p50 (ms)', 'penalty', 'recent decisions', 'state'];
  const rows = [el('tr', {}, ...heads.map((h) => el('th', {}, h)))];
  for (const e of st.engines || []) {
    const cap = num(e.capacity_rps), load = num(e.load_rps), pen = num(e.penalty);
    const state = el('td');
    if (e.suspect) state.append(el('span', { class: 'badge suspect', title: 'stopped reporting metrics' }, 'suspect'));
    if (e.draining) state.append(el('span', { class: 'badge draining' }, 'draining'));
    if (pen !== null && pen < 1) state.append(el('span', { class: 'badge penalized' }, 'penalized'));
    if (!state.childNodes.length) state.append('ok');
    rows.push(el('tr', { 'data-engine': e.name },
      el('td', {}, el('i', { style: `display:inline-block;width:9px;height:9px;border-radius:2px;margin-right:5px;background:${colorOf(st, e.name)}` }), e.name),
      el('td', {}, e.region || '–'),
      el('td', { class: 'num' }, fmt(cap, 1)),
      el('td', { class: 'num' }, fmt(load, 1)),
      el('td', { class: 'num' }, cap && load !== null ? (100 * load / cap).toFixed(0) + '%' : '–'),
      el('td', { class: 'num' }, fmt(e.ttft_p50_ms, 1)),
      el('td', { class: 'num', 'data-penalty': pen === null ? '' : String(pen) }, fmt(pen, 2)),
      decisionLinks(st, e.name),
      state));
  }
  $('engines').replaceChildren(...rows);
}

// decisionLinks links an engine to the recent decisions that picked it, on the sidecar of
// every cluster whose fleet entry names its /debug/decisions (nodes[*].decisions_url).
function decisionLinks(st, engine) {
  const td = el('td', { class: 'decisions' });
  for (const node of Object.keys(st.nodes || {}).sort()) {
    let u;
    try {
      u = new URL(st.nodes[node].decisions_url);
    } catch (err) {
      continue; // none, or not a URL
    }
    if (u.protocol !== 'http:' && u.protocol !== 'https:') continue;
    u.searchParams.set('engine', engine);
    if (td.childNodes.length) td.append(' ');
    td.append(el('a', { href: u.href, target: '_blank', rel: 'noopener', 'data-node': node,
      title: `the last decisions ${node}'s sidecar made for ${engine}` }, node));
  }
  if (!td.childNodes.length) td.append('–');
  return td;
}

function colorOf(st, name) {
  const i = (st.engines || []).findIndex((e) => e.name === name);
  return COLORS[(i < 0 ? 0 : i) % COLORS.length];
}

function renderCharts(st) {
  const names = (st.engines || []).map((e) => e.name);
  const series = (key) => names.map((n) => ({ name: n, color: colorOf(st, n), points: history.map((s) => [s.t, (s.engines[n] || {})[key] ?? null]) }));
  lineChart($('chart-load'), series('load'));
  lineChart($('chart-ttft'), series('ttft'));
  lineChart($('chart-penalty'), series('penalty'), 1);
  const nodes = Object.keys(st.nodes || {}).sort();
  lineChart($('chart-shed'), nodes.map((n, i) => ({ name: n, color: COLORS[(i + 6) % COLORS.length], points: history.map((s) => [s.t, s.shed[n] ?? null]) })), 1);
  $('legend').replaceChildren(...names.map((n) => el('span', {}, el('i', { style: 'background:' + colorOf(st, n) }), n)),
    ...nodes.map((n, i) => el('span', {}, el('i', { style: 'background:' + COLORS[(i + 6) % COLORS.length] }), n + ' (shed)')));
}

// lineChart draws series of [time, value|null] points; nulls break the line.
function lineChart(svg, series, minMax = 0) {
  const W = svg.clientWidth || 400, H = svg.clientHeight || 130, L = 36, B = 16, T = 6, R = 6;
  // The x axis spans the history the page has (at least 30 s), up to HISTORY_MS.
  const now = Date.now();
  const span = Math.min(HISTORY_MS, Math.max(30000, now - (history.length ? history[0].t : now)));
  const t0 = now - span;
  let vmax = minMax;
  for (const s of series) for (const [, v] of s.points) if (v !== null && v > vmax) vmax = v;
  const ns = 'http://www.w3.org/2000/svg';
  const mk = (tag, attrs) => { const e = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); return e; };
  const x = (t) => L + (W - L - R) * (t - t0) / span;
  const y = (v) => T + (H - T - B) * (1 - (vmax ? v / vmax : 0));
  const kids = [mk('line', { x1: L, y1: y(0), x2: W - R, y2: y(0), stroke: '#dde2ea' })];
  const top = mk('text', { x: 2, y: T + 8 }); top.textContent = vmax ? +vmax.toPrecision(3) : 'no data';
  const zero = mk('text', { x: 2, y: y(0) }); zero.textContent = '0';
  const ago = mk('text', { x: L, y: H - 3 }); ago.textContent = span >= 120000 ? '−' + Math.round(span / 60000) + ' min' : '−' + Math.round(span / 1000) + ' s';
  const nowLabel = mk('text', { x: W - R - 18, y: H - 3 }); nowLabel.textContent = 'now';
  kids.push(top, zero, ago, nowLabel);
  for (const s of series) {
    let d = '', pen = false;
    for (const [t, v] of s.points) {
      if (v === null) { pen = false; continue; }
      d += (pen ? 'L' : 'M') + x(t).toFixed(1) + ',' + y(v).toFixed(1);
      pen = true;
    }
    if (d) kids.push(mk('path', { d, fill: 'none', stroke: s.color, 'stroke-width': 1.6, 'data-series': s.name }));
  }
  svg.replaceChildren(...kids);
}

loadHistory().then(poll);
