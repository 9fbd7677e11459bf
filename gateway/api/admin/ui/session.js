// Who is signed in: the admin token and what it allows.
//
// Kept in this tab's sessionStorage (gone when the tab closes, never sent by the browser on its
// own as a cookie would be, not shared with other tabs as localStorage would be), or only in
// memory when the browser refuses storage. Never in a URL, the title or a log.

/**
 * A storage key of this page: `name:` and the page's path. sessionStorage is per origin, so two
 * gateways on one origin behind path prefixes (/a/admin/, /b/admin/) would otherwise share the
 * sign-in, the drafts and a pending single sign-on.
 */
export function scoped(name) {
  return `${name}:${window.location.pathname}`;
}

const KEY = scoped('gateway.admin.token');
let current = null;

function storage() {
  try {
    return window.sessionStorage;
  } catch {
    return null; // storage disabled: the token lives in memory only
  }
}

/**
 * The signed-in session {token, expires_at (unix seconds or null), subject, scopes, sso}, or
 * null. An expired one is still returned: the gateway's 401 then opens the sign-in dialog,
 * which keeps the page as it is.
 */
export function get() {
  if (current === null) {
    try {
      current = JSON.parse(storage()?.getItem(KEY) || 'null');
    } catch {
      current = null;
    }
  }
  return current;
}

/** Whether the session's token has expired by its own expiry time. */
export function expired() {
  const expires = get()?.expires_at;
  return Boolean(expires && expires * 1000 <= Date.now());
}

/** Keep a new session (replacing any other). */
export function set(session) {
  current = {
    token: session.token,
    expires_at: session.expires_at ?? null,
    subject: session.subject ?? '',
    scopes: Array.isArray(session.scopes) ? session.scopes : [],
    sso: Boolean(session.sso),
  };
  try {
    storage()?.setItem(KEY, JSON.stringify(current));
  } catch {
    // quota or disabled storage: memory only
  }
}

/** Forget the token (sign-out). */
export function clear() {
  current = null;
  try {
    storage()?.removeItem(KEY);
  } catch {
    // nothing stored
  }
}

/** The bearer token, or null. */
export function token() {
  return get()?.token ?? null;
}

/** Whether the session may change things (the `admin` scope). */
export function canWrite() {
  return Boolean(get()?.scopes.includes('admin'));
}
