// The admin page's entry module: sections as tabs, the signed-in header, and what a read-only
// token may see. Plain ES modules from this gateway, no framework and no build step: the CSP
// allows scripts from 'self' only, and every file here is the file the browser runs.

import * as api from './api.js';
import * as audit from './audit.js';
import { byId, h, replace, time } from './dom.js';
import * as keys from './keys.js';
import * as live from './live.js';
import * as session from './session.js';
import * as signin from './signin.js';
import * as usage from './usage.js';

const SECTIONS = { keys, usage, live, audit };
const TAB = session.scoped('gateway.admin.tab');
let shown = false; // the sections are on screen (signed in)
let current = 'keys';

function tabs() {
  return [...document.querySelectorAll('[role=tab]')];
}

function select(name, { focus = false } = {}) {
  if (!(name in SECTIONS)) name = 'keys';
  if (current !== name) SECTIONS[current].hide?.();
  current = name;
  for (const tab of tabs()) {
    const mine = tab.id === `tab-${name}`;
    tab.setAttribute('aria-selected', String(mine));
    tab.tabIndex = mine ? 0 : -1; // one tab stop; arrows move between tabs (WAI-ARIA APG)
    byId(tab.getAttribute('aria-controls')).hidden = !mine;
    if (mine && focus) tab.focus();
  }
  try {
    sessionStorage.setItem(TAB, name);
  } catch {
    // not kept: the Keys section next time
  }
  SECTIONS[name].load();
}

function wireTabs() {
  for (const tab of tabs()) {
    tab.addEventListener('click', () => select(tab.id.slice(4)));
    tab.addEventListener('keydown', (event) => {
      const all = tabs();
      const index = all.indexOf(tab);
      const moves = { ArrowRight: index + 1, ArrowLeft: index - 1, Home: 0, End: all.length - 1 };
      if (!(event.key in moves)) return;
      event.preventDefault();
      const next = all[(moves[event.key] + all.length) % all.length];
      select(next.id.slice(4), { focus: true });
    });
  }
}

async function fillModelList() {
  const catalog = await api.catalog();
  replace(byId('models-list'), (catalog || []).map((model) => h('option', { value: model.id })));
}

/** Show or hide what needs the admin scope (a read token sees no write control at all). */
function applyAccess() {
  const write = session.canWrite();
  for (const element of document.querySelectorAll('.write')) {
    if (element.id === 'key-create') {
      if (!write) element.hidden = true; // opened by its button only
    } else element.hidden = !write;
  }
  document.body.classList.toggle('read-only', !write);
}

function signedIn(who) {
  const scopes = who.scopes.includes('admin') ? 'admin' : 'read only';
  const expires = who.expires_at ? time(new Date(who.expires_at * 1000).toISOString()) : null;
  replace(byId('who-text'), 'Signed in as ', h('strong', { class: 'name' }, who.subject || 'unknown'),
    ` (${scopes})`, expires ? [', until ', expires] : null);
  byId('who').hidden = false;
  byId('signin').hidden = true;
  byId('tabs').hidden = false;
  applyAccess();
  if (shown) {
    // Signed in again after a 401: the page stays as it was (forms included); the waiting
    // call is sent again by api.js.
    return;
  }
  shown = true;
  fillModelList();
  const drafts = signin.takeDrafts();
  let start = 'keys';
  try {
    start = sessionStorage.getItem(TAB) || 'keys';
  } catch {
    // the default
  }
  if (drafts?.tab) start = drafts.tab.slice(4);
  select(start);
  keys.restore(drafts);
}

function signedOut() {
  shown = false;
  for (const section of Object.values(SECTIONS)) section.reset();
  byId('who').hidden = true;
  replace(byId('who-text'));
  byId('tabs').hidden = true;
  for (const tab of tabs()) byId(tab.getAttribute('aria-controls')).hidden = true;
  byId('signin').hidden = false;
  byId('token-input').focus();
}

async function main() {
  wireTabs();
  for (const section of Object.values(SECTIONS)) section.init();
  api.onUnauthorized(signin.reauthenticate);
  await signin.start({ signedIn, signedOut });
}

main();
