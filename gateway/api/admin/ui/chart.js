// Bar charts drawn as SVG elements by this code (no chart library): one bar per UTC day.
// Colours come from app.css classes, so they follow the light or dark scheme. Each bar has a
// <title> (the day and value, on hover), and the chart an accessible name; the table under the
// charts holds the same numbers for screen readers and copying.

import { h, svg } from './dom.js';

const WIDTH = 400;
const HEIGHT = 170;
const LEFT = 46;
const RIGHT = 6;
const TOP = 10;
const BOTTOM = 22;
let serial = 0;

/** The smallest 1, 2, 2.5 or 5 times a power of ten at or above `value` (1 for 0). */
export function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (value <= step * power * (1 + 1e-9)) return step * power;
  }
  return 10 * power;
}

/**
 * A bar chart in a <figure>.
 *
 * @param {object} spec title (string), labels (x labels: UTC days 'YYYY-MM-DD'), values
 *   (numbers or null), format (number -> text), unit (for the titles: 'requests'), one (the
 *   unit for exactly 1: 'request'), whole (counts: no tick between whole numbers)
 */
export function barChart({ title, labels, values, format, unit = '', one = unit, whole = false }) {
  serial += 1;
  const captionId = `chart-${serial}`;
  const max = niceCeiling(Math.max(0, ...values.map((value) => value ?? 0)));
  const plotWidth = WIDTH - LEFT - RIGHT;
  const plotHeight = HEIGHT - TOP - BOTTOM;
  const band = plotWidth / Math.max(labels.length, 1);
  const y = (value) => TOP + plotHeight - (value / max) * plotHeight;

  const ticks = whole && !Number.isInteger(max / 2) ? [0, max] : [0, max / 2, max];
  const grid = ticks.map((tick) =>
    svg('g', { class: 'tick' },
      svg('line', { x1: LEFT, x2: WIDTH - RIGHT, y1: y(tick), y2: y(tick) }),
      svg('text', { x: LEFT - 4, y: y(tick) + 4, 'text-anchor': 'end' }, format(tick))));

  const bars = labels.map((label, index) => {
    const value = values[index];
    const top = y(value ?? 0);
    const width = Math.max(band * 0.8, 1);
    return svg('rect', {
      class: value === null ? 'bar empty' : 'bar',
      x: LEFT + index * band + (band - width) / 2,
      y: top,
      width,
      height: Math.max(TOP + plotHeight - top, 0),
    }, svg('title', {}, `${label}: ${value === null ? 'no data' : `${format(value)} ${value === 1 ? one : unit}`.trim()}`));
  });

  // At most about six day labels, always the first and the last.
  const every = Math.max(1, Math.ceil(labels.length / 6));
  const last = labels.length - 1;
  const xLabels = labels.map((label, index) => {
    const edge = index === 0 || index === last;
    if (!edge && (index % every !== 0 || last - index < every)) return null;
    // The first label starts at its bar and the last ends at its bar: none is cut off.
    const anchor = index === 0 && last > 0 ? 'start' : index === last && last > 0 ? 'end' : 'middle';
    const x = { start: LEFT + index * band, end: LEFT + (index + 1) * band }[anchor]
      ?? LEFT + index * band + band / 2;
    return svg('text', { class: 'day', x, y: HEIGHT - 6, 'text-anchor': anchor }, label.slice(5)); // MM-DD
  });

  const chart = svg('svg', {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: 'img',
    'aria-labelledby': captionId,
    focusable: 'false',
  }, grid, bars, xLabels);
  return h('figure', { class: 'chart' }, h('figcaption', { id: captionId }, title), chart);
}
