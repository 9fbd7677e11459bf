// Calls to the gateway: the admin API under v1/ and the sign-in endpoints under oidc/, both
// relative to the page (so the page works behind a proxy that adds a path prefix).
//
// A 401 (an expired or refused token) does not lose the user's work: the call waits for the
// sign-in dialog (set with onUnauthorized) and is then sent again with the new token; the forms
// stay in the page as they were.

import * as session from './session.js';

const MAX_MESSAGE = 300;
let reauthenticate = null;

/** An error answer: `status` (0 when the gateway did not answer) and its message as text. */
export class ApiError extends Error {
  constructor(status, message, type = null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.type = type;
  }
}

/** Set the function called on a 401: it resolves once signed in again, rejects if not. */
export function onUnauthorized(handler) {
  reauthenticate = handler;
}

function truncate(text) {
  const clean = String(text).replace(/\s+/g, ' ').trim();
  return clean.length > MAX_MESSAGE ? `${clean.slice(0, MAX_MESSAGE)}…` : clean;
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`.trim();
  let type = null;
  try {
    const body = await response.json();
    const error = body?.error;
    if (typeof error === 'string') message = error; // Ollama's shape, outside /admin/
    else if (error && typeof error.message === 'string') {
      message = error.message; // OpenAI's shape: the admin API's
      type = error.type ?? null;
    }
  } catch {
    // not JSON: the status line says enough
  }
  return new ApiError(response.status, truncate(message), type);
}

function url(path, query) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query || {})) {
    if (value === null || value === undefined || value === '') continue;
    for (const item of Array.isArray(value) ? value : [value]) params.append(name, String(item));
  }
  const search = params.toString();
  return search ? `${path}?${search}` : path;
}

/**
 * Send one request and return its JSON answer.
 *
 * @param {string} method
 * @param {string} path relative to the page: 'v1/keys', 'oidc/config'
 * @param {object} options query (object; arrays repeat), body (JSON), token (override; false:
 *   none), retry (re-authenticate on a 401; default when the session's token is used)
 * @throws {ApiError} on an error answer or no answer
 */
export async function call(method, path, { query, body, token, retry } = {}) {
  const own = token === undefined;
  for (;;) {
    const bearer = own ? session.token() : token;
    const headers = { Accept: 'application/json' };
    if (bearer) headers.Authorization = `Bearer ${bearer}`;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let response;
    try {
      response = await fetch(url(path, query), {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: 'no-store',
        credentials: 'omit', // no cookie is ever needed: the token is the only credential
        redirect: 'error',
      });
    } catch {
      throw new ApiError(0, 'The gateway did not answer: check the connection and try again.');
    }
    if (response.ok) return response.status === 204 ? null : response.json();
    const error = await errorOf(response);
    if (response.status === 401 && (retry ?? own) && reauthenticate) {
      await reauthenticate(error.message); // rejects if the user gives up
      continue; // the same request again, with the new token
    }
    throw error;
  }
}

export const get = (path, query) => call('GET', path, { query });
export const post = (path, body) => call('POST', path, { body });
export const patch = (path, body) => call('PATCH', path, { body });

let catalogPromise = null;

/**
 * The models the upstreams serve ([{id, upstreams}]), or null when this gateway has no
 * v1/models (the pickers then take typed names). Asked once per sign-in.
 */
export function catalog() {
  if (!catalogPromise) {
    catalogPromise = get('v1/models').then(
      (answer) => (Array.isArray(answer?.data) ? answer.data : null),
      (error) => {
        if (error.status === 404 || error.status === 405) return null;
        catalogPromise = null; // try again next time
        return null;
      },
    );
  }
  return catalogPromise;
}

/** Forget what was asked with the previous token. */
export function forget() {
  catalogPromise = null;
}
