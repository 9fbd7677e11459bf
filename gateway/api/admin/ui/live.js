// The Live section: what this replica is doing now, from v1/live, asked every 3 seconds while
// the section is shown and the tab visible (no polling in a background tab).

import * as api from './api.js';
import { byId, count, h, number, plural, replace, say, seconds, time } from './dom.js';

const PERIOD_MS = 3000;
let active = false;
let timer = 0;
let busy = false;

function table(caption, headers, rows, empty) {
  if (!rows.length) return h('p', { class: 'muted' }, empty);
  return h('div', { class: 'table-wrap', tabindex: 0, role: 'region', 'aria-label': caption },
    h('table', {},
      h('caption', { class: 'sr-only' }, caption), // the heading above says it on screen
      h('thead', {}, h('tr', {}, headers.map(([label, cls]) => h('th', { scope: 'col', class: cls }, label)))),
      h('tbody', {}, rows)));
}

function tile(label, value, detail) {
  return h('div', { class: 'tile' },
    h('div', { class: 'tile-label' }, label),
    h('div', { class: 'tile-value' }, value),
    detail ? h('div', { class: 'tile-detail' }, detail) : null);
}

function circuit(state) {
  const words = { closed: 'closed (healthy)', open: 'open (failing)', half_open: 'half open (probing)' };
  return h('span', { class: `badge circuit-${state}` }, words[state] ?? String(state));
}

function loaded(models) {
  if (models === null || models === undefined) return h('span', { class: 'muted' }, 'not told');
  if (!models.length) return h('span', { class: 'muted' }, 'none');
  return h('ul', { class: 'plain' }, models.map((model) => h('li', {},
    h('span', { class: 'name' }, model.model),
    model.expires_at ? [' until ', time(model.expires_at, { seconds: true })] : ' (kept loaded)')));
}

function reported(report) {
  // What the server's own /metrics says (vLLM, llama.cpp, SGLang): it counts every client.
  if (!report) return h('span', { class: 'muted' }, 'not told');
  const parts = [];
  if (report.waiting != null) parts.push(`${count(report.waiting)} waiting`);
  if (report.running != null) parts.push(`${count(report.running)} running`);
  if (report.kv_cache_usage != null) parts.push(`KV ${number(report.kv_cache_usage * 100)}%`);
  return parts.length ? parts.join(' · ') : h('span', { class: 'muted' }, 'nothing');
}

function render(live) {
  const flight = live.in_flight || {};
  const recent = live.recent || {};
  const upstreams = live.upstreams || [];
  replace(byId('live-body'),
    h('p', { class: 'muted' },
      'Replica ', h('code', {}, live.replica), ' at ', time(live.at, { seconds: true }),
      '. Each replica shows only its own requests; with several, look at each (or at Prometheus).'),
    h('div', { class: 'tiles' },
      tile('In flight', count(flight.total)),
      tile('Queued', count(live.queue?.waiting)),
      tile(`Last ${count(recent.window_seconds)} s`, plural(recent.requests, 'request'),
        plural(recent.errors, 'error')),
      tile('TTFT', seconds(recent.ttft_mean_s), `median ${seconds(recent.ttft_p50_s)}`),
      tile('Decode', recent.decode_tokens_per_s == null ? '—' : `${number(recent.decode_tokens_per_s)} tokens/s`)),
    h('h2', {}, 'Upstreams'),
    table('Upstreams', [['Upstream'], ['Circuit'], ['In flight', 'num'], ['Server says'], ['Models'], ['Loaded now']],
      upstreams.map((upstream) => h('tr', {},
        h('th', { scope: 'row' }, h('span', { class: 'name' }, upstream.upstream),
          h('div', { class: 'muted small' }, upstream.url, ' · ', upstream.dialect)),
        h('td', {}, circuit(upstream.circuit)),
        h('td', { class: 'num' }, count(upstream.in_flight)),
        h('td', {}, reported(upstream.reported)),
        h('td', { class: 'models' }, (upstream.models || []).join(', ')),
        h('td', {}, loaded(upstream.loaded)))),
      'No upstream configured.'),
    h('div', { class: 'columns' },
      h('section', {}, h('h2', {}, 'In flight by key'),
        table('In flight by key', [['Key'], ['Requests', 'num']],
          (flight.by_key || []).map((item) => h('tr', {},
            h('td', {}, h('span', { class: 'name' }, item.name ?? ''), ' ', h('code', { class: 'small' }, item.key_id)),
            h('td', { class: 'num' }, count(item.requests)))),
          'Nothing in flight.')),
      h('section', {}, h('h2', {}, 'In flight by model'),
        table('In flight by model', [['Model'], ['Requests', 'num']],
          (flight.by_model || []).map((item) => h('tr', {},
            h('td', {}, item.model), h('td', { class: 'num' }, count(item.requests)))),
          'Nothing in flight.')),
      h('section', {}, h('h2', {}, 'In flight by upstream'),
        table('In flight by upstream', [['Upstream'], ['Requests', 'num']],
          (flight.by_upstream || []).map((item) => h('tr', {},
            h('td', {}, item.upstream), h('td', { class: 'num' }, count(item.requests)))),
          'Nothing in flight.'))),
    h('h2', {}, `Recent answers by model (last ${count(recent.window_seconds)} s)`),
    table('Recent answers by model', [['Model'], ['Requests', 'num'], ['Mean TTFT', 'num'], ['Decode tokens/s', 'num']],
      (recent.by_model || []).map((item) => h('tr', {},
        h('td', {}, item.model),
        h('td', { class: 'num' }, count(item.requests)),
        h('td', { class: 'num' }, seconds(item.ttft_mean_s)),
        h('td', { class: 'num' }, number(item.decode_tokens_per_s)))),
      'No answer finished in the window.'));
}

async function tick() {
  if (!active || busy || document.visibilityState !== 'visible') return;
  busy = true;
  try {
    render(await api.get('v1/live'));
    say(byId('live-message'), 'Refreshed every 3 seconds while this tab is shown.');
  } catch (error) {
    if (error.status === 404 || error.status === 405) {
      replace(byId('live-body'));
      say(byId('live-message'), 'The live view is not available on this gateway (it has no live endpoint).');
      stop();
    } else say(byId('live-message'), `Could not refresh: ${error.message}`);
  } finally {
    busy = false;
  }
}

function stop() {
  clearInterval(timer);
  timer = 0;
}

/** Start polling (the section is shown). */
export function load() {
  active = true;
  stop();
  tick();
  timer = setInterval(tick, PERIOD_MS);
}

/** Stop polling (another section, or signed out). */
export function hide() {
  active = false;
  stop();
}

/** Wire the section (once): a tab coming back into view refreshes at once. */
export function init() {
  document.addEventListener('visibilitychange', () => {
    if (active && document.visibilityState === 'visible') tick();
  });
}

/** Forget what was shown (sign-out). */
export function reset() {
  hide();
  replace(byId('live-body'));
  say(byId('live-message'), '');
}
