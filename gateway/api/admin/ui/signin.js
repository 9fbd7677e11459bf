// Signing in and out: a pasted admin token, or single sign-on with the OpenID Connect
// authorization-code flow and PKCE (RFC 7636, S256) against the provider the gateway names at
// oidc/config. The code goes to the gateway (oidc/token), which exchanges it and answers with
// the token the admin API accepts; the browser never talks to the provider's token endpoint.

import * as api from './api.js';
import { byId, fillForm, formValues, say } from './dom.js';
import * as session from './session.js';

// {state, nonce, verifier, redirect_uri} while away; half-filled forms kept across the trip
const PENDING = session.scoped('gateway.admin.oidc');
const DRAFTS = session.scoped('gateway.admin.drafts');

let hooks = { signedIn() {}, signedOut() {} };
let oidc = null; // oidc/config when single sign-on is enabled
let pendingReauth = null; // {promise, resolve, reject} while the dialog is open

function base64url(bytes) {
  let text = '';
  for (const byte of new Uint8Array(bytes)) text += String.fromCharCode(byte);
  return btoa(text).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function randomText(size) {
  return base64url(crypto.getRandomValues(new Uint8Array(size)));
}

/** The page's own URL without query or fragment: the redirect URI the provider sends back to. */
function redirectUri() {
  return `${window.location.origin}${window.location.pathname}`;
}

/** The claims of a JWT, unverified (the gateway verifies; this only fills in what whoami would). */
function claimsOf(token) {
  try {
    const payload = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    return JSON.parse(atob(payload.padEnd(payload.length + ((4 - (payload.length % 4)) % 4), '=')));
  } catch {
    return {};
  }
}

/**
 * Check a token with the gateway and return the session it opens.
 *
 * whoami says who and what; a gateway without it is asked for one key instead (the token is
 * valid when that answers) and the scopes are read from the token's own `scope` claim.
 */
async function check(token) {
  try {
    const who = await api.call('GET', 'v1/whoami', { token });
    const expires = who.expires_at ? Math.floor(Date.parse(who.expires_at) / 1000) : null;
    return { token, subject: who.subject, scopes: who.scopes, expires_at: expires };
  } catch (error) {
    if (error.status !== 404 && error.status !== 405) throw error;
  }
  await api.call('GET', 'v1/keys', { token, query: { limit: 1 } });
  const claims = claimsOf(token);
  let scopes = typeof claims.scope === 'string' ? claims.scope.split(' ') : [];
  scopes = scopes.filter((scope) => scope === 'admin' || scope === 'read');
  if (!scopes.length) scopes = ['admin', 'read']; // unknown: the API refuses what it must
  if (scopes.includes('admin') && !scopes.includes('read')) scopes.push('read');
  const expires = typeof claims.exp === 'number' ? claims.exp : null;
  return { token, subject: String(claims.sub ?? ''), scopes, expires_at: expires };
}

function explain(error) {
  if (error.status === 403 && error.message === 'token grants no admin scope') {
    // /admin/v1's terse refusal (oidc/token says more itself)
    return `${error.message}: this account is in neither the admin nor the read group.`;
  }
  if (error.status === 404) return 'The admin API is off on this gateway.';
  return error.message;
}

/** Save the page's half-filled forms before leaving for the identity provider. */
function saveDrafts() {
  const drafts = {};
  for (const form of document.querySelectorAll('form[data-draft]')) {
    const open = !form.hidden && (form.closest('dialog') === null || form.closest('dialog').open);
    if (open) drafts[form.id] = formValues(form);
  }
  drafts.tab = document.querySelector('[role=tab][aria-selected=true]')?.id ?? null;
  try {
    sessionStorage.setItem(DRAFTS, JSON.stringify(drafts));
  } catch {
    // lost on return: nothing more to do
  }
}

/** The drafts saved before an SSO round trip ({formId: values, tab}), read once. */
export function takeDrafts() {
  try {
    const drafts = JSON.parse(sessionStorage.getItem(DRAFTS) || 'null');
    sessionStorage.removeItem(DRAFTS);
    return drafts;
  } catch {
    return null;
  }
}

/** Restore a saved draft into its form (once the form's fields exist). */
export function restoreDraft(drafts, form) {
  if (drafts && drafts[form.id]) fillForm(form, drafts[form.id]);
}

async function startSso(errorId) {
  if (!oidc) return;
  if (!window.crypto?.subtle) {
    say(byId(errorId), 'Single sign-on needs the page over HTTPS (or on localhost).');
    return;
  }
  const verifier = randomText(32); // 43 characters, RFC 7636 section 4.1
  const challenge = base64url(
    await crypto.subtle.digest('SHA-256', new TextEncoder().encode(verifier)),
  );
  const pending = {
    state: randomText(16),
    nonce: randomText(16),
    verifier,
    redirect_uri: redirectUri(),
  };
  sessionStorage.setItem(PENDING, JSON.stringify(pending));
  saveDrafts();
  const target = new URL(oidc.authorization_endpoint);
  const params = {
    response_type: 'code',
    client_id: oidc.client_id,
    redirect_uri: pending.redirect_uri,
    scope: oidc.scope || 'openid',
    state: pending.state,
    nonce: pending.nonce,
    code_challenge: challenge,
    code_challenge_method: 'S256',
  };
  for (const [name, value] of Object.entries(params)) target.searchParams.set(name, value);
  window.location.assign(target.href);
}

/** Show a single sign-on failure beside the SSO button (not under the token field). */
function ssoFailed(message) {
  // Without oidc/config (the gateway could not read the provider) the SSO box is hidden.
  say(byId(byId('sso-box').hidden ? 'signin-error' : 'sso-error'), message);
}

/** Finish a return from the identity provider (?code&state or ?error); true if it was one. */
async function finishSso() {
  const params = new URLSearchParams(window.location.search);
  if (!params.has('code') && !params.has('error')) return false;
  // Out of the address bar and the history at once: the code is single-use, but no value of
  // the sign-in stays where it could be copied or bookmarked.
  window.history.replaceState(null, '', window.location.pathname);
  let pending = null;
  try {
    pending = JSON.parse(sessionStorage.getItem(PENDING) || 'null');
  } catch {
    pending = null;
  }
  sessionStorage.removeItem(PENDING);
  const ours = Boolean(pending) && params.get('state') === pending.state;
  if (params.has('error')) {
    // The provider's words only for this tab's own sign-in (its state: RFC 6749 sections 4.1.2.1
    // and 10.12): anyone can link to the page with ?error=...&error_description=<any text>.
    if (!ours) {
      ssoFailed('The single sign-on was not completed: sign in again.');
      return true;
    }
    const text = params.get('error_description') || params.get('error');
    ssoFailed(`The identity provider refused the sign-in: ${text.slice(0, 200)}`);
    return true;
  }
  if (!ours) {
    ssoFailed('That sign-in answer does not belong to this tab (state mismatch): sign in again.');
    return true;
  }
  try {
    const answer = await api.call('POST', 'oidc/token', {
      token: false,
      body: {
        code: params.get('code'),
        code_verifier: pending.verifier,
        redirect_uri: pending.redirect_uri,
        nonce: pending.nonce,
      },
    });
    session.set({ ...answer, sso: true });
    finishReauth();
  } catch (failure) {
    ssoFailed(explain(failure));
  }
  return true;
}

async function loadOidc() {
  oidc = null;
  let config = null;
  try {
    config = await api.call('GET', 'oidc/config', { token: false });
  } catch (error) {
    if (error.status !== 404) {
      const note = byId('sso-unavailable');
      note.textContent = `Single sign-on is unavailable now: ${error.message}`;
      note.hidden = false;
    }
  }
  if (config?.enabled && config.authorization_endpoint && config.client_id) oidc = config;
  byId('sso-box').hidden = !oidc;
  byId('reauth-sso-box').hidden = !oidc;
}

/**
 * Sign out here, then at the identity provider: OpenID Connect RP-Initiated Logout 1.0 section 2
 * (client_id; post_logout_redirect_uri, the page itself, so the user lands back here signed
 * out; id_token_hint when the page's token is the ID token). The page's session is cleared
 * first, so coming back (or not) never finds the token still kept.
 */
function endSession() {
  if (!oidc?.end_session_endpoint) return;
  const target = new URL(oidc.end_session_endpoint);
  target.searchParams.set('client_id', oidc.client_id);
  target.searchParams.set('post_logout_redirect_uri', redirectUri());
  const current = session.get();
  if (current?.sso && current.token && oidc.token === 'id_token') {
    target.searchParams.set('id_token_hint', current.token);
  }
  signOut();
  window.location.assign(target.href);
}

function showEndSession() {
  byId('sso-end-session').hidden = !(oidc?.end_session_endpoint && session.get()?.sso);
}

async function signInWithToken(input, errorElement) {
  const token = input.value.trim();
  say(errorElement, '');
  say(byId('sso-error'), '');
  if (!token) return false;
  try {
    session.set(await check(token));
  } catch (error) {
    say(errorElement, explain(error));
    return false;
  }
  input.value = '';
  return true;
}

function finishReauth() {
  api.forget();
  showEndSession();
  hooks.signedIn(session.get());
  if (pendingReauth) {
    const { resolve } = pendingReauth;
    pendingReauth = null;
    byId('reauth-dialog').close();
    resolve();
  }
}

/**
 * The 401 handler of api.js: open the sign-in dialog over the page (its forms untouched) and
 * resolve once signed in again; reject if the user cancels.
 */
export function reauthenticate(reason) {
  if (pendingReauth) return pendingReauth.promise;
  if (!session.get()) {
    // Never signed in (or signed out meanwhile): the sign-in screen, not a dialog.
    hooks.signedOut();
    return Promise.reject(new api.ApiError(401, reason));
  }
  let resolve;
  let reject;
  const promise = new Promise((ok, fail) => {
    resolve = ok;
    reject = fail;
  });
  pendingReauth = { promise, resolve, reject };
  byId('reauth-reason').textContent = reason;
  say(byId('reauth-error'), '');
  const dialog = byId('reauth-dialog');
  dialog.showModal();
  byId('reauth-token').focus();
  return promise;
}

function cancelReauth() {
  if (!pendingReauth) return;
  const { reject } = pendingReauth;
  pendingReauth = null;
  const dialog = byId('reauth-dialog');
  if (dialog.open) dialog.close();
  reject(new api.ApiError(401, 'Not signed in: sign in again, then repeat the action.'));
}

/** Forget the token and show the sign-in screen. */
export function signOut() {
  session.clear();
  api.forget();
  byId('sso-end-session').hidden = true;
  hooks.signedOut();
}

/**
 * Wire the sign-in controls; then finish an SSO return, or resume the stored session, or show
 * the sign-in screen.
 */
export async function start(callbacks) {
  hooks = callbacks;
  byId('token-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    if (await signInWithToken(byId('token-input'), byId('signin-error'))) finishReauth();
  });
  byId('reauth-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    if (await signInWithToken(byId('reauth-token'), byId('reauth-error'))) finishReauth();
  });
  byId('reauth-cancel').addEventListener('click', cancelReauth);
  byId('reauth-dialog').addEventListener('cancel', (event) => {
    event.preventDefault(); // Escape: cancel properly, rejecting the waiting call
    cancelReauth();
  });
  byId('sso-sign-in').addEventListener('click', () => startSso('sso-error'));
  byId('reauth-sso').addEventListener('click', () => startSso('reauth-error'));
  byId('sign-out').addEventListener('click', signOut);
  byId('sso-end-session').addEventListener('click', endSession);

  const expired = session.expired();
  if (expired) session.clear();
  await loadOidc();
  if (await finishSso()) {
    if (!session.get()) {
      hooks.signedOut();
      const failure = byId('sso-error');
      if (!failure.hidden) failure.focus(); // beside the button pressed, not the token field
    }
    return;
  }
  if (session.get()) {
    showEndSession();
    hooks.signedIn(session.get());
    return;
  }
  if (expired) say(byId('signin-note'), 'Your sign-in has expired: sign in again.');
  hooks.signedOut();
}
