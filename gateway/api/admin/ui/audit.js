// The Audit section: the trail of key changes, oldest first, filtered by key, actor, action and
// time (the browser's zone in the form; sent to the API in UTC), paged by the API's cursor.

import * as api from './api.js';
import { byId, count, formValues, fromLocalInput, h, replace, say, time } from './dom.js';

const PAGE = 50;
const state = { cursors: [null], index: 0, next: null, asked: 0 };

const ISO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;

/** A changed value: a time in the browser's zone (UTC on hover), else as text or JSON. */
function show(value) {
  if (value === null || value === undefined) return 'none';
  if (typeof value === 'string' && ISO_TIME.test(value)) return time(value, { seconds: true });
  return typeof value === 'string' ? value : JSON.stringify(value);
}

/**
 * "rpm: 5 → 10" lines for an entry's changes. A create records every field (before: none);
 * only those it set are listed. A rotation's secret is never recorded, only that it changed.
 */
function changesCell(changes) {
  if (!changes) return h('td', { class: 'muted' }, '—');
  const lines = [];
  for (const [field, change] of Object.entries(changes)) {
    const label = h('span', { class: 'change-field' }, field);
    if (!(change && typeof change === 'object' && 'before' in change && 'after' in change)) {
      lines.push(h('li', {}, label, ': ', show(change)));
    } else if (field === 'secret') {
      lines.push(h('li', {}, label, ': replaced'));
    } else if (JSON.stringify(change.before) !== JSON.stringify(change.after)) {
      lines.push(h('li', {}, label, ': ', show(change.before), ' → ', show(change.after)));
    }
  }
  if (!lines.length) return h('td', { class: 'muted' }, 'no change');
  return h('td', { class: 'changes' }, h('ul', { class: 'plain' }, lines));
}

function query() {
  const values = formValues(byId('audit-form'));
  return {
    key_id: values.key_id.trim(),
    actor: values.actor.trim(),
    action: values.action,
    since: fromLocalInput(values.since),
    until: fromLocalInput(values.until),
  };
}

/** Load the current page of the trail with the current filters. */
export async function load() {
  const message = byId('audit-message');
  let filters;
  try {
    filters = query();
  } catch (error) {
    say(message, error.message);
    return;
  }
  const ticket = ++state.asked; // an older answer arriving late is dropped
  say(message, 'Loading…');
  try {
    const page = await api.get('v1/audit', { ...filters, limit: PAGE, cursor: state.cursors[state.index] });
    if (ticket !== state.asked) return;
    state.next = page.next_cursor;
    replace(byId('audit-table').tBodies[0], page.data.map((entry) => h('tr', { dataset: { entryId: entry.id } },
      h('td', {}, time(entry.at, { seconds: true })),
      h('td', { class: 'name' }, entry.actor),
      h('td', {}, h('span', { class: `badge action-${entry.action}` }, entry.action)),
      h('td', {}, entry.key_id ? h('code', {}, entry.key_id) : '—'),
      h('td', {}, entry.source ?? h('span', { class: 'muted' }, 'CLI')),
      changesCell(entry.changes))));
    const first = state.index * PAGE + 1;
    say(message, page.data.length ? '' : 'No entry matches.');
    byId('audit-page').textContent = page.data.length
      ? `Entries ${count(first)}–${count(first + page.data.length - 1)}` : '';
  } catch (error) {
    if (ticket !== state.asked) return;
    say(message, `Could not read the audit trail: ${error.message}`);
  }
  byId('audit-prev').disabled = state.index === 0;
  byId('audit-next').disabled = !state.next;
}

function restart() {
  state.cursors = [null];
  state.index = 0;
  return load();
}

/** Wire the section's controls (once). */
export function init() {
  byId('audit-form').addEventListener('submit', (event) => {
    event.preventDefault();
    restart();
  });
  byId('audit-prev').addEventListener('click', () => {
    if (state.index === 0) return;
    state.index -= 1;
    load();
  });
  byId('audit-next').addEventListener('click', () => {
    if (!state.next) return;
    state.cursors = state.cursors.slice(0, state.index + 1);
    state.cursors.push(state.next);
    state.index += 1;
    load();
  });
}

/** Forget what was shown and the filters (sign-out). */
export function reset() {
  state.asked += 1; // an answer still on its way is dropped
  byId('audit-form').reset();
  state.cursors = [null];
  state.index = 0;
  state.next = null;
  replace(byId('audit-table').tBodies[0]);
  byId('audit-page').textContent = '';
  say(byId('audit-message'), '');
}
