// The Keys section: list (search by name, filter by status and model, paged by the API's
// cursor), create, edit, rotate and revoke. A secret is shown once, in a dialog, and cleared
// from the page when the dialog closes. Without the admin scope no write control is made.

import * as api from './api.js';
import {
  byId, count, fillForm, fromLocalInput, h, replace, say, time, toLocalInput,
} from './dom.js';
import * as session from './session.js';

const PAGE = 50;
const LIMITS = [
  ['rpm', 'Requests per minute', 'RPM'],
  ['tpm', 'Tokens per minute', 'TPM'],
  ['max_concurrent', 'Requests at once', 'At once'],
];

const state = {
  cursors: [null], // the cursor of each page seen so far: Previous goes back through them
  index: 0,
  next: null,
  shown: new Map(), // id -> key, the rows on screen
  create: null, // the create form's fields, built on first open
  edit: null, // {key, fields} while the edit dialog is open
  rotating: null,
  revoking: null,
  draft: null, // a create form kept across a single sign-on round trip
  created: null, // a key just created, to mark in the next list shown
  timer: 0,
  asked: 0, // the latest list request: an older answer arriving late is dropped
};

function limitText(value) {
  if (value === null || value === undefined) return 'default';
  return value === 0 ? 'unlimited' : count(value);
}

function sameModels(a, b) {
  if (a === null || b === null) return a === b;
  return a.length === b.length && [...a].sort().every((model, i) => model === [...b].sort()[i]);
}

/**
 * The fields of a key (name, models, limits, expiry, model management), for the create form
 * and the edit dialog. Models are ticked from the gateway's catalog, or typed (comma-separated)
 * when the catalog lacks them or the gateway has none.
 */
function keyFields(prefix, catalog) {
  const id = (name) => `${prefix}-${name}`;
  const name = h('input', {
    type: 'text', id: id('name'), name: 'name', required: true, maxlength: 200, autocomplete: 'off',
  });
  const every = h('input', { type: 'radio', id: id('models-every'), name: 'models_mode', value: 'every', checked: true });
  const some = h('input', { type: 'radio', id: id('models-some'), name: 'models_mode', value: 'some' });
  const boxes = (catalog || []).map((model) =>
    h('label', { class: 'check' },
      h('input', { type: 'checkbox', name: 'models', value: model.id }), ' ', model.id));
  const other = h('input', {
    type: 'text', id: id('models-other'), name: 'models_other', autocomplete: 'off',
    spellcheck: 'false', 'aria-describedby': id('models-help'),
  });
  const pick = () => { some.checked = true; };
  for (const box of boxes) box.querySelector('input').addEventListener('change', pick);
  other.addEventListener('input', () => { if (other.value.trim()) pick(); });

  const limits = LIMITS.map(([field, label]) => h('input', {
    type: 'number', id: id(field), name: field, min: 0, max: 2147483647, step: 1,
    inputmode: 'numeric', placeholder: 'default', 'aria-describedby': id('limits-help'),
  }));
  const expires = h('input', {
    type: 'datetime-local', id: id('expires'), name: 'expires_at', 'aria-describedby': id('expires-help'),
  });
  const manage = h('input', { type: 'checkbox', id: id('manage'), name: 'manage_models', value: 'yes' });

  const element = h('div', { class: 'fields' },
    h('div', { class: 'field wide' }, h('label', { for: id('name') }, 'Name'), name),
    h('fieldset', { class: 'field wide models' },
      h('legend', {}, 'Models it may use'),
      h('label', { class: 'check' }, every, ' Every model'),
      h('label', { class: 'check' }, some, ' Only these:'),
      catalog
        ? h('div', { class: 'model-list', role: 'group', 'aria-label': 'Models the upstreams serve' }, boxes)
        : h('p', { class: 'help' }, 'This gateway does not list its models here: type their names.'),
      h('label', { for: id('models-other') }, catalog ? 'Other models' : 'Models'),
      other,
      h('p', { id: id('models-help'), class: 'help' }, 'Names separated by commas, e.g. llama3.2, qwen2.5:7b.')),
    LIMITS.map(([field, label], index) =>
      h('div', { class: 'field' }, h('label', { for: id(field) }, label), limits[index])),
    h('p', { id: id('limits-help'), class: 'help wide' },
      'Limits: empty uses the gateway\'s default, 0 means unlimited.'),
    h('div', { class: 'field' }, h('label', { for: id('expires') }, 'Expires'), expires,
      h('p', { id: id('expires-help'), class: 'help' }, 'In your time zone; empty: never.')),
    h('div', { class: 'field' },
      h('label', { class: 'check' }, manage, ' May pull, copy and delete models')));

  function read() {
    const body = { name: name.value.trim() };
    if (!body.name) throw new Error('Give the key a name.');
    if (some.checked) {
      const ticked = boxes.map((box) => box.querySelector('input')).filter((box) => box.checked).map((box) => box.value);
      const typed = other.value.split(',').map((model) => model.trim()).filter(Boolean);
      const models = [...new Set([...ticked, ...typed])];
      if (!models.length) throw new Error('Tick or type at least one model, or choose Every model.');
      body.models = models;
    } else body.models = null;
    LIMITS.forEach(([field, label], index) => {
      const text = limits[index].value.trim();
      if (!text) body[field] = null;
      else {
        const value = Number(text);
        if (!Number.isInteger(value) || value < 0 || value > 2147483647) {
          throw new Error(`${label}: a whole number from 0, or empty for the default.`);
        }
        body[field] = value;
      }
    });
    body.expires_at = fromLocalInput(expires.value);
    body.manage_models = manage.checked;
    return body;
  }

  function fill(key) {
    name.value = key.name;
    const known = new Set((catalog || []).map((model) => model.id));
    every.checked = key.models === null;
    some.checked = key.models !== null;
    for (const box of boxes) {
      const input = box.querySelector('input');
      input.checked = Boolean(key.models?.includes(input.value));
    }
    other.value = (key.models || []).filter((model) => !known.has(model)).join(', ');
    LIMITS.forEach(([field], index) => {
      limits[index].value = key[field] === null ? '' : String(key[field]);
    });
    expires.value = toLocalInput(key.expires_at);
    manage.checked = key.manage_models;
  }

  return { element, read, fill, expires, name };
}

/** The fields an edit changed: PATCH sends only those. */
function changes(before, after, fields) {
  const changed = {};
  if (after.name !== before.name) changed.name = after.name;
  if (!sameModels(before.models, after.models)) changed.models = after.models;
  for (const [field] of LIMITS) if (after[field] !== before[field]) changed[field] = after[field];
  // Compared as the input shows them (minutes), so an untouched expiry is not re-sent.
  if (fields.expires.value !== toLocalInput(before.expires_at)) changed.expires_at = after.expires_at;
  if (after.manage_models !== before.manage_models) changed.manage_models = after.manage_models;
  return changed;
}

function filters() {
  return {
    name: byId('keys-name').value.trim(),
    status: byId('keys-status').value,
    model: byId('keys-model').value.trim(),
  };
}

function actions(key) {
  if (!session.canWrite()) return null; // no column at all: its header is hidden too
  if (key.status === 'revoked') return h('td', { class: 'write actions' });
  const button = (label, verb, handler, cls) => h('button', {
    type: 'button', class: cls, 'aria-label': `${verb} key ${key.name}`,
    dataset: { action: verb.toLowerCase() }, onclick: () => handler(key),
  }, label);
  return h('td', { class: 'write actions' }, h('div', {},
    button('Edit', 'Edit', openEdit),
    button('Rotate', 'Rotate', openRotate),
    button('Revoke', 'Revoke', openRevoke, 'danger')));
}

function row(key) {
  const grace = key.rotation_grace_until && Date.parse(key.rotation_grace_until) > Date.now();
  // data-label: the column's name, shown beside each value where the table stacks (a phone).
  const cell = (label, props, ...content) => h('td', { ...props, 'data-label': label }, h('div', {}, ...content));
  const controls = actions(key);
  controls?.setAttribute('data-label', 'Actions');
  return h('tr', { dataset: { keyId: key.id } },
    h('th', { scope: 'row', class: 'name', 'data-label': 'Name' }, h('div', {}, key.name)),
    cell('Id', {}, h('code', {}, key.id)),
    cell('Status', {},
      h('span', { class: `badge status-${key.status}` }, key.status),
      grace ? h('div', { class: 'muted small' }, 'old secret until ', time(key.rotation_grace_until)) : null),
    cell('Models', { class: 'models' }, key.models === null
      ? h('span', { class: 'muted' }, 'every model')
      : key.models.join(', ')),
    cell('Limits', { class: 'limits' },
      LIMITS.map(([field, , short]) => h('div', {}, `${short}: ${limitText(key[field])}`)),
      key.manage_models ? h('div', {}, 'manages models') : null),
    cell('Expires', {}, time(key.expires_at)),
    cell('Last used', {}, time(key.last_used_at)),
    cell('Created', {}, time(key.created_at)),
    controls);
}

/** Load the current page of keys with the current filters. */
export async function load() {
  const message = byId('keys-message');
  const ticket = ++state.asked;
  say(message, 'Loading…');
  try {
    const page = await api.get('v1/keys', {
      ...filters(), limit: PAGE, cursor: state.cursors[state.index],
    });
    if (ticket !== state.asked) return;
    state.next = page.next_cursor;
    state.shown = new Map(page.data.map((key) => [key.id, key]));
    replace(byId('keys-table').tBodies[0], page.data.map(row));
    const first = state.index * PAGE + 1;
    const filtered = Object.values(filters()).some(Boolean);
    say(message, page.data.length ? '' : filtered ? 'No key matches.' : 'No key yet.');
    if (state.created) showCreated(state.created); // with the rows, in the same task
    state.created = null;
    byId('keys-page').textContent = page.data.length
      ? `Keys ${count(first)}–${count(first + page.data.length - 1)}` : '';
  } catch (error) {
    if (ticket !== state.asked) return;
    say(message, `Could not list keys: ${error.message}`);
  }
  byId('keys-prev').disabled = state.index === 0;
  byId('keys-next').disabled = !state.next;
}

function restart() {
  // A search (Enter, a filter changed) also ends a pending typing pause: its timer would
  // otherwise reload page 1 after the user had moved on to the next page.
  clearTimeout(state.timer);
  state.cursors = [null];
  state.index = 0;
  return load();
}

async function openCreate() {
  const form = byId('key-create');
  if (!state.create) {
    state.create = keyFields('create', await api.catalog());
    replace(byId('key-create-fields'), state.create.element);
  }
  if (state.draft) {
    fillForm(form, state.draft);
    state.draft = null;
  }
  form.hidden = false;
  byId('key-new').setAttribute('aria-expanded', 'true');
  state.create.name.focus();
}

function closeCreate() {
  const form = byId('key-create');
  form.reset();
  form.hidden = true;
  say(byId('key-create-error'), '');
  byId('key-new').setAttribute('aria-expanded', 'false');
  byId('key-new').focus();
}

async function submitCreate(event) {
  event.preventDefault();
  const error = byId('key-create-error');
  say(error, '');
  let body;
  try {
    body = state.create.read();
  } catch (problem) {
    say(error, problem.message);
    return;
  }
  const submit = byId('key-create-submit');
  submit.disabled = true;
  try {
    const answer = await api.post('v1/keys', body);
    closeCreate();
    showSecret(answer, 'created');
    // The list again from its first page, the filters as the user left them; the new key is
    // marked there, or, when the filters or the page leave it out, shown marked at the top.
    state.created = answer.key;
    await restart();
  } catch (problem) {
    say(error, problem.message); // the form keeps what was typed
  } finally {
    submit.disabled = false;
  }
}

/** Mark a just-created key in the list (added at the top when the list leaves it out). */
function showCreated(key) {
  const body = byId('keys-table').tBodies[0];
  let line = [...body.rows].find((tr) => tr.dataset.keyId === key.id);
  if (!line) {
    line = row(key);
    body.prepend(line);
    state.shown.set(key.id, key);
  }
  line.classList.add('just-created');
  say(byId('keys-message'), `Created key ${key.name} (marked in the list).`);
}

function showSecret(answer, what) {
  byId('secret-title').textContent = what === 'rotated'
    ? 'Copy the new secret now' : 'Copy the key\'s secret now';
  byId('secret-key-name').textContent = answer.key.name;
  const input = byId('secret-value');
  input.value = answer.secret;
  say(byId('secret-copied'), '');
  byId('secret-dialog').showModal();
  input.focus();
  input.select();
}

async function copySecret() {
  const input = byId('secret-value');
  const copied = byId('secret-copied');
  try {
    await navigator.clipboard.writeText(input.value);
    say(copied, 'Copied to the clipboard.');
  } catch {
    // No clipboard API (a page not served over HTTPS or from localhost): the selection.
    input.focus();
    input.select();
    say(copied, 'Copying was refused by the browser: the secret is selected, press Ctrl+C (⌘C).');
  }
}

function closeSecret() {
  byId('secret-value').value = ''; // not left in the page once the dialog is gone
  const dialog = byId('secret-dialog');
  if (dialog.open) dialog.close();
}

async function openEdit(key) {
  const fields = keyFields('edit', await api.catalog());
  fields.fill(key);
  state.edit = { key, fields };
  replace(byId('edit-fields'), fields.element);
  byId('edit-key-name').textContent = key.name;
  say(byId('edit-error'), '');
  byId('edit-dialog').showModal();
  fields.name.focus();
}

async function submitEdit(event) {
  event.preventDefault();
  const { key, fields } = state.edit;
  const error = byId('edit-error');
  say(error, '');
  let changed;
  try {
    changed = changes(key, fields.read(), fields);
  } catch (problem) {
    say(error, problem.message);
    return;
  }
  if (!Object.keys(changed).length) {
    say(error, 'Nothing changed.');
    return;
  }
  const save = byId('edit-save');
  save.disabled = true;
  try {
    await api.patch(`v1/keys/${encodeURIComponent(key.id)}`, changed);
    byId('edit-dialog').close();
    state.edit = null;
    say(byId('keys-message'), `Saved key ${key.name}.`);
    await load();
  } catch (problem) {
    say(error, problem.message);
  } finally {
    save.disabled = false;
  }
}

function openRotate(key) {
  state.rotating = key;
  byId('rotate-key-name').textContent = key.name;
  say(byId('rotate-error'), '');
  byId('rotate-dialog').showModal();
  byId('rotate-grace').focus();
}

async function submitRotate(event) {
  event.preventDefault();
  const key = state.rotating;
  const error = byId('rotate-error');
  const grace = Number(byId('rotate-grace').value);
  if (!Number.isInteger(grace) || grace < 0 || grace > 2592000) {
    say(error, 'Grace: a whole number of seconds from 0 to 2,592,000.');
    return;
  }
  const confirm = byId('rotate-confirm');
  confirm.disabled = true;
  try {
    const answer = await api.post(`v1/keys/${encodeURIComponent(key.id)}/rotate`, { grace_seconds: grace });
    byId('rotate-dialog').close();
    state.rotating = null;
    showSecret(answer, 'rotated');
    await load();
  } catch (problem) {
    say(error, problem.message);
  } finally {
    confirm.disabled = false;
  }
}

function openRevoke(key) {
  state.revoking = key;
  byId('revoke-key-name').textContent = key.name;
  say(byId('revoke-error'), '');
  byId('revoke-dialog').showModal();
  byId('revoke-cancel').focus(); // the safe choice is the default one
}

async function confirmRevoke() {
  const key = state.revoking;
  const confirm = byId('revoke-confirm');
  confirm.disabled = true;
  try {
    await api.post(`v1/keys/${encodeURIComponent(key.id)}/revoke`, {});
    byId('revoke-dialog').close();
    state.revoking = null;
    say(byId('keys-message'), `Revoked key ${key.name}.`);
    await load();
  } catch (problem) {
    say(byId('revoke-error'), problem.message);
  } finally {
    confirm.disabled = false;
  }
}

/** Wire the section's controls (once). */
export function init() {
  byId('keys-filter').addEventListener('submit', (event) => {
    event.preventDefault();
    restart();
  });
  byId('keys-name').addEventListener('input', () => {
    clearTimeout(state.timer);
    state.timer = setTimeout(restart, 300); // as the user types, one request per pause
  });
  byId('keys-status').addEventListener('change', restart);
  byId('keys-model').addEventListener('change', restart);
  byId('keys-prev').addEventListener('click', () => {
    if (state.index === 0) return;
    state.index -= 1;
    load();
  });
  byId('keys-next').addEventListener('click', () => {
    if (!state.next) return;
    state.cursors = state.cursors.slice(0, state.index + 1);
    state.cursors.push(state.next);
    state.index += 1;
    load();
  });
  byId('key-new').addEventListener('click', () => {
    if (byId('key-create').hidden) openCreate();
    else closeCreate();
  });
  byId('key-create').addEventListener('submit', submitCreate);
  byId('key-create-cancel').addEventListener('click', closeCreate);
  byId('secret-copy').addEventListener('click', copySecret);
  byId('secret-close').addEventListener('click', closeSecret);
  byId('secret-dialog').addEventListener('cancel', (event) => event.preventDefault()); // close says "stored"
  byId('secret-dialog').addEventListener('close', () => { byId('secret-value').value = ''; });
  byId('edit-form').addEventListener('submit', submitEdit);
  byId('edit-cancel').addEventListener('click', () => byId('edit-dialog').close());
  byId('rotate-form').addEventListener('submit', submitRotate);
  byId('rotate-cancel').addEventListener('click', () => byId('rotate-dialog').close());
  byId('revoke-confirm').addEventListener('click', confirmRevoke);
  byId('revoke-cancel').addEventListener('click', () => byId('revoke-dialog').close());
}

/** Open the create form with values kept across a single sign-on round trip. */
export function restore(drafts) {
  if (drafts?.['key-create'] && session.canWrite()) {
    state.draft = drafts['key-create'];
    openCreate();
  }
}

/** Forget everything shown, the filters too (sign-out). */
export function reset() {
  clearTimeout(state.timer);
  state.asked += 1; // an answer still on its way is dropped
  byId('keys-filter').reset();
  replace(byId('keys-table').tBodies[0]);
  state.shown.clear();
  state.created = null;
  state.cursors = [null];
  state.index = 0;
  state.next = null;
  state.create = null;
  replace(byId('key-create-fields'));
  byId('key-create').hidden = true;
  byId('keys-page').textContent = '';
  say(byId('keys-message'), '');
  closeSecret();
  for (const id of ['edit-dialog', 'rotate-dialog', 'revoke-dialog']) {
    if (byId(id).open) byId(id).close();
  }
}
