// Small DOM helpers. Every value reaches the page as text (a text node or an attribute set with
// setAttribute), never as markup: a key named `<img src=x onerror=alert(1)>` shows as those
// characters. Nothing in this page uses innerHTML.

const SVG_NS = 'http://www.w3.org/2000/svg';

/** Append children: strings and numbers as text nodes, null/undefined/false skipped. */
export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

function build(element, props, children) {
  for (const [name, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === 'class') element.setAttribute('class', value);
    else if (name === 'text') element.textContent = String(value);
    else if (name === 'dataset') Object.assign(element.dataset, value);
    else if (name.startsWith('on') && typeof value === 'function') {
      element.addEventListener(name.slice(2), value);
    } else element.setAttribute(name, value === true ? '' : String(value));
  }
  return append(element, children);
}

/** An HTML element: h('td', {class: 'num'}, 'text', child, ...). */
export function h(tag, props, ...children) {
  return build(document.createElement(tag), props, children);
}

/** An SVG element, as h(). */
export function svg(tag, props, ...children) {
  return build(document.createElementNS(SVG_NS, tag), props, children);
}

/** Replace an element's children. */
export function replace(parent, ...children) {
  parent.replaceChildren();
  return append(parent, children);
}

/** The element with this id (throws if missing: a typo shows at once). */
export function byId(id) {
  const element = document.getElementById(id);
  if (!element) throw new Error(`no element #${id}`);
  return element;
}

/** Show a message in an error or note element (as text), or hide it when empty. */
export function say(element, message) {
  element.textContent = message || '';
  if (element.classList.contains('error')) element.hidden = !message;
}

const dateTime = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });
const dateTimeSeconds = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' });

/** "2026-12-06 17:22:09 UTC": what a time's title shows on hover. */
export function utcText(date) {
  return date.toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
}

/** A <time> in the browser's zone, its UTC form in the title; a dash for no time. */
export function time(iso, { seconds = false } = {}) {
  if (!iso) return h('span', { class: 'muted', text: '—' });
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return h('span', { text: String(iso) });
  const format = seconds ? dateTimeSeconds : dateTime;
  return h('time', { datetime: date.toISOString(), title: utcText(date) }, format.format(date));
}

const integer = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });

/** A count with the browser's digit grouping; a dash for null. */
export function count(value) {
  return value === null || value === undefined ? '—' : integer.format(value);
}

/**
 * "1 request", "2 requests": a count and the word, singular for exactly one.
 *
 * @param {number|null} value the count (a dash for null)
 * @param {string} one the singular ('request'); `many` defaults to it with an s
 */
export function plural(value, one, many = `${one}s`) {
  return `${count(value)} ${value === 1 ? one : many}`;
}

/** A rate or mean with one decimal; a dash for null. */
export function number(value) {
  return value === null || value === undefined ? '—' : decimal.format(value);
}

/** Seconds as "53 ms" or "1.2 s"; a dash for null. */
export function seconds(value) {
  if (value === null || value === undefined) return '—';
  return value < 1 ? `${integer.format(value * 1000)} ms` : `${decimal.format(value)} s`;
}

/** The value of a datetime-local input (the browser's zone) for an ISO time. */
export function toLocalInput(iso) {
  if (!iso) return '';
  const date = new Date(iso);
  const pad = (n) => String(n).padStart(2, '0');
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}` +
    `T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

/** An ISO time in UTC for a datetime-local input's value (read in the browser's zone). */
export function fromLocalInput(value) {
  if (!value) return null;
  const date = new Date(value); // a date-time without an offset is local time (ECMA-262 21.4.3.2)
  if (Number.isNaN(date.getTime())) throw new Error(`not a time: ${value}`);
  return date.toISOString();
}

/** A form's named fields as {name: value}, checkboxes as arrays of the checked values. */
export function formValues(form) {
  const values = {};
  for (const field of form.elements) {
    if (!field.name || field.disabled) continue;
    if (field.type === 'checkbox') {
      if (!Array.isArray(values[field.name])) values[field.name] = [];
      if (field.checked) values[field.name].push(field.value);
    } else if (field.type === 'radio') {
      if (field.checked) values[field.name] = field.value;
    } else values[field.name] = field.value;
  }
  return values;
}

/** Put values made by formValues() back into a form's fields (those that exist now). */
export function fillForm(form, values) {
  for (const field of form.elements) {
    if (!field.name || !(field.name in values)) continue;
    const value = values[field.name];
    if (field.type === 'checkbox') field.checked = Array.isArray(value) && value.includes(field.value);
    else if (field.type === 'radio') field.checked = field.value === value;
    else field.value = value;
  }
}
