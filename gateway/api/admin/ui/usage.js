// The Usage section: per key and model per UTC day over a chosen range, as charts (one per
// measure, summed per day), a table with totals, and a CSV file built here from the same JSON.

import * as api from './api.js';
import { barChart } from './chart.js';
import { byId, count, h, replace, say, seconds } from './dom.js';

const DAY_MS = 86400000;
const COLUMNS = [
  'day', 'key_id', 'name', 'model', 'requests', 'errors', 'input_tokens', 'output_tokens',
  'ttft_count', 'ttft_us_sum', 'generation_us_sum', 'mean_ttft_s',
];
let report = null;
let asked = 0; // the latest request: an older answer arriving late is dropped

function utcDay(date) {
  return date.toISOString().slice(0, 10);
}

/** Every UTC day from `since` to `until` (inclusive), as 'YYYY-MM-DD'. */
function daysBetween(since, until) {
  const days = [];
  for (let at = Date.parse(`${since}T00:00:00Z`); at <= Date.parse(`${until}T00:00:00Z`); at += DAY_MS) {
    days.push(utcDay(new Date(at)));
    if (days.length > 400) break; // the API refuses more than 366 anyway
  }
  return days;
}

// A field a spreadsheet would run as a formula: one starting (after any spaces) with = + - @,
// a tab or a carriage return, their full-width forms (＝ ＋ － ＠, which some spreadsheets
// read as the ASCII ones) or | (DDE). OWASP, "CSV Injection":
// https://owasp.org/www-community/attacks/CSV_Injection
const FORMULA = /^\s*[=+\-@\t\r\uFF1D\uFF0B\uFF0D\uFF20|]/;
// What stays as it is although it starts so: a plain number (-5, +1.5e3) or a lone "-".
const PLAIN = /^\s*(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|-)\s*$/;

/**
 * One CSV field (RFC 4180): always in double quotes (so no separator a spreadsheet's locale
 * uses, `;` included, can split it), with a formula defused by a leading `'` (OWASP, above).
 *
 * @param {*} value a cell: null and undefined are empty
 * @returns {string} the quoted field
 */
export function csvField(value) {
  if (value === null || value === undefined) return '""';
  let text = String(value);
  if (FORMULA.test(text) && !PLAIN.test(text)) text = `'${text}`;
  return `"${text.replace(/"/g, '""')}"`;
}

/** The report as CSV text: a header and one line per row. */
export function toCsv(rows) {
  const lines = [COLUMNS.map(csvField).join(',')];
  for (const row of rows) lines.push(COLUMNS.map((column) => csvField(row[column])).join(','));
  return `${lines.join('\r\n')}\r\n`;
}

function download() {
  if (!report) return;
  const blob = new Blob([toCsv(report.rows)], { type: 'text/csv;charset=utf-8' });
  const link = h('a', { href: URL.createObjectURL(blob), download: `usage-${report.since}-${report.until}.csv` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

function perDay(rows, days) {
  const sums = new Map(days.map((day) => [day, {
    requests: 0, errors: 0, input_tokens: 0, output_tokens: 0, ttft_count: 0, ttft_us_sum: 0,
  }]));
  for (const row of rows) {
    const sum = sums.get(row.day);
    if (!sum) continue;
    for (const name of Object.keys(sum)) sum[name] += row[name] ?? 0;
  }
  return days.map((day) => sums.get(day));
}

function tile(label, value) {
  return h('div', { class: 'tile' }, h('div', { class: 'tile-label' }, label), h('div', { class: 'tile-value' }, value));
}

function render(answer) {
  report = answer;
  const { rows, totals } = answer;
  const days = daysBetween(answer.since, answer.until);
  const sums = perDay(rows, days);
  replace(byId('usage-totals'),
    tile('Requests', count(totals.requests)),
    tile('Errors', count(totals.errors)),
    tile('Input tokens', count(totals.input_tokens)),
    tile('Output tokens', count(totals.output_tokens)),
    tile('Mean TTFT', seconds(totals.mean_ttft_s)));
  const chart = (title, values, format, one) => barChart({
    title, labels: days, values, format, unit: one && `${one}s`, one, whole: format === count,
  });
  replace(byId('usage-charts'),
    chart('Requests per day', sums.map((s) => s.requests), count, 'request'),
    chart('Input tokens per day', sums.map((s) => s.input_tokens), count, 'token'),
    chart('Output tokens per day', sums.map((s) => s.output_tokens), count, 'token'),
    chart('Errors per day', sums.map((s) => s.errors), count, 'error'),
    chart('Mean TTFT per day', sums.map((s) => (s.ttft_count ? s.ttft_us_sum / s.ttft_count / 1e6 : null)), seconds));
  replace(byId('usage-table').tBodies[0], rows.map((row) => h('tr', {},
    h('td', {}, row.day),
    h('td', {}, row.name === null ? h('span', { class: 'muted' }, 'deleted key') : h('span', { class: 'name' }, row.name),
      ' ', h('code', { class: 'small' }, row.key_id)),
    h('td', {}, row.model),
    h('td', { class: 'num' }, count(row.requests)),
    h('td', { class: 'num' }, count(row.errors)),
    h('td', { class: 'num' }, count(row.input_tokens)),
    h('td', { class: 'num' }, count(row.output_tokens)),
    h('td', { class: 'num' }, seconds(row.mean_ttft_s)))));
  replace(byId('usage-table').tFoot, rows.length ? h('tr', {},
    h('th', { scope: 'row', colspan: 3 }, 'Total'),
    h('td', { class: 'num' }, count(totals.requests)),
    h('td', { class: 'num' }, count(totals.errors)),
    h('td', { class: 'num' }, count(totals.input_tokens)),
    h('td', { class: 'num' }, count(totals.output_tokens)),
    h('td', { class: 'num' }, seconds(totals.mean_ttft_s))) : null);
  say(byId('usage-message'), rows.length
    ? `${answer.since} to ${answer.until} (UTC days).`
    : `No usage from ${answer.since} to ${answer.until} (UTC days).`);
  byId('usage-csv').disabled = !rows.length;
}

/** Load usage for the range and filters in the form. */
export async function load() {
  const ticket = ++asked;
  say(byId('usage-message'), 'Loading…');
  try {
    const answer = await api.get('v1/usage', {
      since: byId('usage-since').value,
      until: byId('usage-until').value,
      key_id: byId('usage-key').value.trim(),
      model: byId('usage-model').value.trim(),
    });
    if (ticket === asked) render(answer);
  } catch (error) {
    if (ticket !== asked) return;
    say(byId('usage-message'), `Could not read usage: ${error.message}`);
  }
}

function defaultRange() {
  const today = new Date();
  byId('usage-until').value = utcDay(today);
  byId('usage-since').value = utcDay(new Date(today.getTime() - 29 * DAY_MS));
}

/** Wire the section's controls (once). */
export function init() {
  defaultRange();
  byId('usage-form').addEventListener('submit', (event) => {
    event.preventDefault();
    load();
  });
  byId('usage-csv').addEventListener('click', download);
}

/** Forget what was shown and the filters (sign-out). */
export function reset() {
  asked += 1; // an answer still on its way is dropped
  byId('usage-form').reset();
  report = null;
  for (const id of ['usage-totals', 'usage-charts']) replace(byId(id));
  replace(byId('usage-table').tBodies[0]);
  replace(byId('usage-table').tFoot);
  byId('usage-csv').disabled = true;
  say(byId('usage-message'), '');
  defaultRange();
}
