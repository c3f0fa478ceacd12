// The Drover console. Every value from the server goes into the page with
// textContent or an attribute, never as HTML.
'use strict';
(function () {
  const ROLES = { viewer: 1, operator: 2, admin: 3 };
  const RUN_STATUSES = ['succeeded', 'failed', 'timed_out', 'canceled', 'skipped', 'missed', 'running', 'pending'];
  let me = null; // {id, name, role, csrf}
  let gen = 0; // render generation: a stale view stops drawing
  let live = null; // the EventSource of the run page
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'text') e.textContent = String(v);
      else if (k === 'class') e.className = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return e;
  }
  const can = (role) => !!me && ROLES[me.role] >= ROLES[role];
  const enc = encodeURIComponent;

  class APIError extends Error {
    constructor(status, code, message) { super(message); this.status = status; this.code = code; }
  }

  // At most maxInFlight API calls at once: the server bounds the requests
  // in flight per token, and a page of pipes asks for two things per row.
  const maxInFlight = 8;
  let inFlight = 0;
  const waiting = [];
  async function api(method, path, body) {
    if (inFlight >= maxInFlight) await new Promise((resolve) => waiting.push(resolve)); // handed a slot
    else inFlight++;
    try {
      return await call(method, path, body);
    } finally {
      const next = waiting.shift();
      if (next) next(); else inFlight--;
    }
  }

  async function call(method, path, body) {
    const headers = { Accept: 'application/json' };
    const opts = { method, headers, credentials: 'same-origin' };
    if (method !== 'GET' && method !== 'HEAD') headers['X-CSRF-Token'] = me ? me.csrf : '';
    if (body !== undefined) { headers['Content-Type'] = 'application/json'; opts.body = JSON.stringify(body); }
    const resp = await fetch(path, opts);
    if (resp.status === 204) return null;
    let data = null;
    try { data = await resp.json(); } catch (e) { data = null; }
    if (!resp.ok) {
      const err = (data && data.error) || {};
      if (resp.status === 401 && !path.startsWith('/ui/login')) showLogin();
      throw new APIError(resp.status, err.code || String(resp.status), err.message || resp.statusText);
    }
    return data;
  }

  // Query strings from an object; arrays repeat the key; empty values drop.
  function qs(o) {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(o)) {
      for (const x of [].concat(v)) if (x !== '' && x !== undefined && x !== null) p.append(k, x);
    }
    const s = p.toString();
    return s ? '?' + s : '';
  }

  // ---- formatting ----
  function fmtTime(iso, tz) {
    if (!iso) return '—';
    const d = new Date(iso);
    try {
      return new Intl.DateTimeFormat(undefined, { dateStyle: 'short', timeStyle: 'medium', timeZone: tz || undefined }).format(d);
    } catch (e) { return d.toISOString(); }
  }
  const viewerZone = Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC';
  function ago(iso) {
    if (!iso) return '—';
    const s = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
    if (Math.abs(s) < 60) return s + ' s ago';
    if (Math.abs(s) < 3600) return Math.round(s / 60) + ' min ago';
    if (Math.abs(s) < 86400) return Math.round(s / 3600) + ' h ago';
    return Math.round(s / 86400) + ' d ago';
  }
  function scheduleWords(s) {
    if (!s) return '—';
    const named = { '@hourly': 'every hour', '@daily': 'every day at midnight', '@midnight': 'every day at midnight', '@weekly': 'every Sunday at midnight', '@monthly': 'on the 1st of every month', '@yearly': 'every 1 January', '@annually': 'every 1 January' };
    if (named[s]) return named[s];
    if (s.startsWith('@every ')) return 'every ' + s.slice(7);
    const f = s.trim().split(/\s+/);
    if (f.length !== 5) return s;
    const [mi, h, dom, mon, dow] = f;
    const pad = (x) => String(x).padStart(2, '0');
    const rest = dom === '*' && mon === '*';
    if (/^\*\/\d+$/.test(mi) && h === '*' && rest && dow === '*') return 'every ' + mi.slice(2) + ' minutes';
    if (mi === '*' && h === '*' && rest && dow === '*') return 'every minute';
    if (/^\d+$/.test(mi) && h === '*' && rest && dow === '*') return 'every hour at minute ' + mi;
    if (/^\d+$/.test(mi) && /^\d+$/.test(h) && rest) {
      const at = pad(h) + ':' + pad(mi);
      if (dow === '*') return 'every day at ' + at;
      if (dow === '1-5') return 'weekdays at ' + at;
      const days = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];
      if (/^[0-7]$/.test(dow)) return 'every ' + days[Number(dow) % 7] + ' at ' + at;
    }
    return s;
  }
  const status = (s) => el('span', { class: 'status s-' + s, text: s });
  const tags = (m) => Object.entries(m || {}).sort().map(([k, v]) => el('span', { class: 'tag', text: k + '=' + v }));
  function parseTags(text) {
    const out = {};
    for (const part of text.split(/[\s,]+/)) {
      if (!part) continue;
      const i = part.indexOf('=');
      if (i <= 0) throw new Error('tags are key=value: ' + part);
      out[part.slice(0, i)] = part.slice(i + 1);
    }
    return out;
  }
  // Log bytes as text: ANSI escapes and other control characters go.
  function logText(b64) {
    const bin = atob(b64 || '');
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const s = new TextDecoder().decode(bytes);
    // eslint-disable-next-line no-control-regex
    return s.replace(/\x1b\[[0-?]*[ -/]*[@-~]/g, '').replace(/\x1b[\]P^_][^\x07\x1b]*(\x07|\x1b\\)?/g, '').replace(/[\x00-\x08\x0b-\x1f\x7f]/g, '');
  }

  // ---- building blocks ----
  function table(headers, rows) {
    return el('div', { class: 'scroll' }, el('table', {},
      el('thead', {}, el('tr', {}, headers.map((h) => el('th', { text: h })))),
      el('tbody', {}, rows)));
  }
  const row = (...cells) => el('tr', {}, cells.map((c) => el('td', {}, c)));
  const link = (href, text) => el('a', { href, text });
  function msg(text, cls) { return el('p', { class: cls || 'muted', text }); }
  function errorBox(e) { return el('p', { class: 'error', role: 'alert', text: (e && e.message) || String(e) }); }

  // A button that asks again before it acts (no browser dialog).
  function confirmButton(label, onYes) {
    const wrap = el('span', {});
    const b = el('button', { type: 'button', class: 'danger', text: label, 'data-action': label.toLowerCase() });
    b.addEventListener('click', () => {
      wrap.replaceChildren(el('span', { text: 'Really ' + label.toLowerCase() + '? ' }),
        el('button', { type: 'button', class: 'danger', text: 'Yes, ' + label.toLowerCase(), 'data-action': 'confirm', onclick: async () => {
          try { await onYes(); } catch (e) { wrap.replaceChildren(errorBox(e)); }
        } }),
        el('button', { type: 'button', text: 'No', onclick: () => wrap.replaceChildren(b) }));
    });
    wrap.append(b);
    return wrap;
  }

  // A paged list: fetch(cursor) gives {rows, next}; "More" asks the server
  // for the next page.
  function pagedTable(headers, fetchPage) {
    const tbody = el('tbody', {});
    const more = el('button', { type: 'button', text: 'More', hidden: true });
    const box = el('div', {}, el('div', { class: 'scroll' }, el('table', {}, el('thead', {}, el('tr', {}, headers.map((h) => el('th', { text: h })))), tbody)), more);
    let cursor = '';
    async function load() {
      more.hidden = true;
      try {
        const page = await fetchPage(cursor);
        tbody.append(...page.rows);
        if (page.rows.length === 0 && !tbody.firstChild) tbody.append(el('tr', {}, el('td', { colspan: headers.length, class: 'muted', text: 'None.' })));
        cursor = page.next || '';
        more.hidden = !cursor;
      } catch (e) { box.append(errorBox(e)); }
    }
    more.addEventListener('click', load);
    load();
    return box;
  }

  function filterForm(fields, onSubmit) {
    const inputs = {};
    const f = el('form', { class: 'inline' }, fields.map(([name, label, opts]) => {
      const inp = opts ? el('select', { name, 'aria-label': label }, el('option', { value: '', text: label + ': any' }), opts.map((o) => el('option', { value: o, text: o })))
        : el('input', { name, placeholder: label, 'aria-label': label });
      inputs[name] = inp;
      return inp;
    }), el('button', { type: 'submit', text: 'Filter' }));
    f.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const v = {};
      for (const [k, i] of Object.entries(inputs)) v[k] = i.value.trim();
      onSubmit(v);
    });
    return f;
  }

  // ---- views ----
  const views = {};

  // The fleet page is counted on the server (GET /ui/fleet), so that it
  // stays small with any number of agents and runs.
  views.fleet = async (view, g) => {
    view.append(el('h1', { text: 'Fleet' }));
    const f = await api('GET', '/ui/fleet');
    if (g !== gen) return;
    const n = f.agents;
    const card = (label, v, href) => el('a', { class: 'card', href, 'data-count': label }, el('div', { class: 'n', text: v }), el('div', { text: label }));
    view.append(el('div', { class: 'cards' },
      card('online', n.online, '#/agents?status=online'), card('offline', n.offline, '#/agents?status=offline'),
      card('revoked', n.revoked, '#/agents?status=revoked'), card('stale manifest', n.stale, '#/agents'),
      card('identity problems', n.identity, '#/agents'), card('runs (24 h)', f.runs + (f.runs_truncated ? '+' : ''), '#/runs')));
    view.append(el('h2', { text: 'Pipes failing or missed (24 h)' }));
    view.append(f.bad.length === 0 ? msg('None.') : table(['Pipe', 'Failed', 'Missed', 'Last bad run'],
      f.bad.map((b) => row(link('#/pipe/' + enc(b.pipe), b.pipe), b.failed, b.missed, link('#/run/' + enc(b.last_id), b.last_status + ' ' + ago(b.last_at))))));
    if (f.bad_total > f.bad.length) view.append(msg(f.bad_total + ' pipes failed or missed; the ' + f.bad.length + ' worst are shown.'));
    view.append(el('h2', { text: 'Runs by hour (24 h)' }));
    if (f.heat.length === 0) view.append(msg('No runs in the last 24 hours.'));
    else {
      const since = new Date(f.since).getTime();
      const grid = el('div', { class: 'heat' });
      grid.style.gridTemplateColumns = 'minmax(6rem, 12rem) repeat(' + f.heat[0].cells.length + ', 1fr)';
      for (const r of f.heat) {
        grid.append(el('a', { class: 'label', href: '#/pipe/' + enc(r.pipe), text: r.pipe }));
        r.cells.forEach((c, h) => {
          const cell = el('div', { class: 'cell' });
          if (c) {
            cell.classList.add('s-' + c.split(' ')[0]);
            cell.title = new Date(since + h * 3600000).toISOString().slice(0, 13) + 'h: worst ' + c + ' runs';
          }
          grid.append(cell);
        });
      }
      view.append(grid, msg('Each cell is one hour, coloured by its worst run: failed, missed, canceled, running, succeeded.' +
        (f.heat_pipes > f.heat.length ? ' ' + f.heat.length + ' of ' + f.heat_pipes + ' pipes shown, the failing first.' : '')));
    }
    view.append(el('h2', { text: 'Agents needing attention' }));
    view.append(f.problems.length === 0 ? msg('None.') : table(['Agent', 'State', 'Manifest', 'Identity'],
      f.problems.map((a) => row(link('#/agent/' + enc(a.id), a.name || a.hostname || a.id), status(a.revoked ? 'revoked' : a.online ? 'online' : 'offline'),
        (a.manifest_state || '') + (a.manifest_expired ? ' expired' : '') + (a.manifest_error ? ': ' + a.manifest_error : ''),
        a.identity_conflicts > 0 ? a.identity_conflicts + ' conflicts' : ''))));
    if (f.problems_total > f.problems.length) view.append(msg(f.problems_total + ' agents need attention; the first ' + f.problems.length + ' are shown.'));
  };

  async function nextFire(name) {
    try {
      const s = await api('GET', '/api/v1/pipes/' + enc(name) + '/schedule' + qs({ count: 1 }));
      if (!s.enabled) return [el('span', { class: 'muted', text: 'disabled' })];
      const t = s.fire_times && s.fire_times[0];
      if (!t) return ['—'];
      return [fmtTime(t, s.timezone) + ' (' + (s.timezone || 'UTC') + ')', el('br'), el('span', { class: 'muted', text: fmtTime(t, viewerZone) + ' (' + viewerZone + ')' })];
    } catch (e) { return [el('span', { class: 'error', text: e.message })]; }
  }
  async function lastResult(name) {
    try {
      const rs = (await api('GET', '/api/v1/runs' + qs({ pipe: name, limit: 20 }))).runs;
      if (!rs.length) return ['never ran'];
      const counts = {};
      for (const r of rs) counts[r.status] = (counts[r.status] || 0) + 1;
      return [status(rs[0].status), ' ', ago(rs[0].created_at), el('br'),
        el('span', { class: 'muted', text: 'last 20: ' + Object.entries(counts).map(([s, k]) => s + ' ' + k).join(', ') })];
    } catch (e) { return [el('span', { class: 'error', text: e.message })]; }
  }

  views.pipes = async (view, g, params) => {
    view.append(el('h1', { text: 'Pipes' }));
    const search = params.get('q') || '';
    const tag = params.get('tag') || '';
    const f = filterForm([['q', 'search name or description'], ['tag', 'tag key=value']], (v) => { location.hash = '#/pipes' + qs(v); });
    f.elements.q.value = search; f.elements.tag.value = tag;
    view.append(f);
    const needle = search.toLowerCase();
    view.append(pagedTable(['Pipe', 'Schedule', 'Next fire', 'Targets', 'Last result'], async (cursor) => {
      const page = await api('GET', '/api/v1/pipes' + qs({ limit: 50, cursor, tag: tag ? tag.split(/[\s,]+/) : [] }));
      const rows = [];
      for (const p of page.pipes) {
        if (needle && !(p.name.toLowerCase().includes(needle) || (p.spec.description || '').toLowerCase().includes(needle))) continue;
        const nf = el('td', { text: '…' });
        const lr = el('td', { text: '…' });
        const t = p.spec.targets || {};
        rows.push(el('tr', { 'data-pipe': p.name },
          el('td', {}, link('#/pipe/' + enc(p.name), p.name), p.spec.description ? [el('br'), el('span', { class: 'muted', text: p.spec.description })] : null),
          el('td', {}, scheduleWords(p.spec.schedule), el('br'), el('code', { class: 'muted', text: p.spec.schedule })),
          nf, el('td', {}, tags(t.tags), (t.agents || []).map((a) => el('span', { class: 'tag', text: 'agent ' + a }))), lr));
        nextFire(p.name).then((c) => { if (g === gen) nf.replaceChildren(...c); });
        lastResult(p.name).then((c) => { if (g === gen) lr.replaceChildren(...c); });
      }
      return { rows, next: page.next_cursor };
    }));
  };

  // A line diff (longest common subsequence) of two texts.
  function diffLines(a, b) {
    const x = a.split('\n'); const y = b.split('\n');
    const m = x.length; const n = y.length;
    const L = Array.from({ length: m + 1 }, () => new Uint16Array(n + 1));
    for (let i = m - 1; i >= 0; i--) for (let j = n - 1; j >= 0; j--) L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
    const out = [];
    let i = 0; let j = 0;
    while (i < m || j < n) {
      if (i < m && j < n && x[i] === y[j]) { out.push(el('div', { text: '  ' + x[i] })); i++; j++; } else if (j < n && (i >= m || L[i][j + 1] >= L[i + 1][j])) { out.push(el('div', { class: 'add', text: '+ ' + y[j] })); j++; } else { out.push(el('div', { class: 'del', text: '- ' + x[i] })); i++; }
    }
    return el('pre', { class: 'spec diff' }, out);
  }
  const specText = (v) => JSON.stringify({ spec: v.spec, payload: v.payload }, null, 2);

  views.pipe = async (view, g, params, name) => {
    const p = await api('GET', '/api/v1/pipes/' + enc(name));
    // The agents it targets: the server filters by the targets' tags.
    const tg = p.spec.targets || {};
    const tagQuery = Object.entries(tg.tags || {}).map(([k, v]) => k + '=' + v);
    const [vers, sched, fires, agentsPage] = await Promise.all([
      api('GET', '/api/v1/pipes/' + enc(name) + '/versions' + qs({ limit: 100 })),
      api('GET', '/api/v1/pipes/' + enc(name) + '/schedule' + qs({ count: 5 })),
      api('GET', '/api/v1/pipes/' + enc(name) + '/fires' + qs({ limit: 48 })),
      api('GET', '/api/v1/agents' + qs({ limit: 1000, tag: tagQuery })),
    ]);
    if (g !== gen) return;
    view.append(el('h1', {}, 'Pipe ', el('span', { id: 'pipe-name', text: p.name }), ' ', el('span', { class: 'muted', text: 'v' + p.version })));
    if (p.spec.description) view.append(msg(p.spec.description));
    view.append(el('p', {}, el('strong', { text: scheduleWords(p.spec.schedule) }), ' ', el('code', { text: p.spec.schedule }), ' in ', p.spec.timezone || 'UTC'));
    if (p.placement) {
      // placement: one: who holds it, under which lease (docs/placement.md).
      const pl = p.placement;
      const line = el('p', { id: 'placement' }, el('strong', { text: 'Placement: one' }), ' — ');
      if (pl.holder) {
        line.append('held by ', link('#/agent/' + enc(pl.holder), pl.holder), ', lease until ' + fmtTime(pl.lease_until, viewerZone));
        if (pl.reported && pl.reported.lease_ended) line.append(el('span', { class: 'muted', text: ' (the holder reports its lease ended)' }));
      } else if (pl.previous) {
        line.append('handing over from ' + pl.previous + '; the next holder starts after ' + fmtTime(pl.next_after, viewerZone));
      } else {
        line.append('no holder (no healthy targeted agent)');
      }
      if (pl.move_to) line.append(el('span', { class: 'muted', text: ' — move to ' + pl.move_to + ' requested' }));
      view.append(line);
    }
    view.append(table(['Next fire (' + (sched.timezone || 'UTC') + ')', 'Your time (' + viewerZone + ')'],
      (sched.fire_times || []).map((t) => row(fmtTime(t, sched.timezone), fmtTime(t, viewerZone)))));
    const holders = agentsPage.agents.filter((a) => !a.revoked && (!(tg.agents || []).length || tg.agents.includes(a.id) || tg.agents.includes(a.name)));
    if (can('operator')) {
      const mode = el('select', { id: 'run-mode', 'aria-label': 'run on' }, el('option', { value: 'all', text: 'all its agents' }), el('option', { value: 'agent', text: 'one agent' }), el('option', { value: 'tags', text: 'agents with tags' }));
      const agentSel = el('select', { id: 'run-agent', 'aria-label': 'agent', hidden: true }, holders.map((a) => el('option', { value: a.id, text: a.name || a.hostname || a.id })));
      const tagIn = el('input', { id: 'run-tags', placeholder: 'key=value', 'aria-label': 'tags', hidden: true });
      mode.addEventListener('change', () => { agentSel.hidden = mode.value !== 'agent'; tagIn.hidden = mode.value !== 'tags'; });
      const out = el('div', { id: 'run-result' });
      const f = el('form', { class: 'inline', id: 'run-now' }, el('strong', { text: 'Run now on' }), mode, agentSel, tagIn, el('button', { type: 'submit', class: 'primary', text: 'Run now' }));
      f.addEventListener('submit', async (ev) => {
        ev.preventDefault();
        out.replaceChildren();
        try {
          const body = {};
          if (mode.value === 'agent') body.agent = agentSel.value;
          if (mode.value === 'tags') body.tags = parseTags(tagIn.value);
          const r = await api('POST', '/api/v1/pipes/' + enc(name) + '/run', body);
          out.append(msg('Sent to ' + r.sent.length + ' agent(s)' + (r.offline.length ? ', ' + r.offline.length + ' offline' : '') + '.', ''),
            link('#/runs?request_id=' + enc(r.request_id), 'runs of this request'));
          setTimeout(() => { if (g === gen) render(); }, 1500);
        } catch (e) { out.append(errorBox(e)); }
      });
      view.append(f, out);
    }
    view.append(el('h2', { text: 'Recent runs' }));
    view.append(pagedTable(['Run', 'Agent', 'Status', 'Trigger', 'Scheduled', 'Started', ''], async (cursor) => {
      const page = await api('GET', '/api/v1/runs' + qs({ pipe: name, limit: 20, cursor }));
      return { rows: page.runs.map(runRow), next: page.next_cursor };
    }));
    view.append(el('h2', { text: 'Fire times (24 h)' }));
    view.append((fires.fires || []).length === 0 ? msg('No fire times in the window.') : table(['Fire time', 'Expected', ...RUN_STATUSES, 'unreported'],
      fires.fires.map((f) => row(fmtTime(f.at, fires.timezone), f.expected, ...RUN_STATUSES.map((s) => (f.counts || {})[s] || ''), f.unreported || ''))));
    view.append(el('h2', { text: 'Agents holding it (targeted)' }));
    view.append(holders.length === 0 ? msg('No agent holds it.') : table(['Agent', 'State', 'Applied version', 'Next fire (reported)', 'Apply error'],
      holders.slice(0, 200).map((a) => {
        const ps = (a.pipes || []).find((x) => x.name === name) || {};
        return row(link('#/agent/' + enc(a.id), a.name || a.hostname || a.id), status(a.online ? 'online' : 'offline'), ps.version ? 'v' + ps.version : 'not reported',
          ps.next_fire_times && ps.next_fire_times[0] ? fmtTime(ps.next_fire_times[0], p.spec.timezone) : '—', ps.apply_error || '');
      })));
    if (holders.length > 200) view.append(msg(holders.length + ' agents; the first 200 are shown.'));
    view.append(el('h2', { text: 'Spec' }), el('pre', { class: 'spec', id: 'spec', text: specText(p) }));
    view.append(el('h2', { text: 'Versions' }));
    const diffOut = el('div', { id: 'diff' });
    const va = el('select', { 'aria-label': 'from version' }); const vb = el('select', { 'aria-label': 'to version' });
    const byVersion = new Map(vers.versions.map((v) => [String(v.version), v]));
    for (const v of vers.versions) { va.append(el('option', { value: v.version, text: 'v' + v.version })); vb.append(el('option', { value: v.version, text: 'v' + v.version })); }
    if (vers.versions.length > 1) va.value = String(vers.versions[1].version);
    view.append(el('div', { class: 'toolbar' }, 'Diff', va, 'to', vb, el('button', { type: 'button', text: 'Show diff', onclick: () => {
      diffOut.replaceChildren(diffLines(specText(byVersion.get(va.value)), specText(byVersion.get(vb.value))));
    } })), diffOut);
    view.append(table(['Version', 'Created', 'Digest', ''], vers.versions.map((v) => row('v' + v.version + (v.current ? ' (current)' : ''), fmtTime(v.created_at),
      el('code', { text: (p.versions || []).find((x) => x.version === v.version)?.digest || '' }),
      !v.current && can('operator') ? el('button', { type: 'button', text: 'Restore v' + v.version, 'data-restore': v.version, onclick: async (ev) => {
        try { await api('POST', '/api/v1/pipes/' + enc(name) + '/versions/' + v.version + '/restore'); render(); } catch (e) { ev.target.after(errorBox(e)); }
      } }) : ''))));
  };

  function runRow(r) {
    const cancel = (r.status === 'running' || r.status === 'pending') && can('operator')
      ? el('button', { type: 'button', text: 'Cancel', 'data-cancel': r.id, onclick: async (ev) => {
        try { await api('POST', '/api/v1/runs/' + enc(r.id) + '/cancel'); ev.target.replaceWith(msg('cancel sent', '')); } catch (e) { ev.target.after(errorBox(e)); }
      } }) : '';
    return row(link('#/run/' + enc(r.id), r.id), link('#/agent/' + enc(r.agent_id), r.agent_id), status(r.status), r.trigger,
      r.scheduled_at ? fmtTime(r.scheduled_at) : '—', r.started_at ? fmtTime(r.started_at) : '—', cancel);
  }

  views.runs = async (view, g, params) => {
    view.append(el('h1', { text: 'Runs' }));
    const cur = { pipe: params.get('pipe') || '', agent: params.get('agent') || '', status: params.get('status') || '', request_id: params.get('request_id') || '' };
    const f = filterForm([['pipe', 'pipe'], ['agent', 'agent id'], ['status', 'status', RUN_STATUSES]], (v) => { location.hash = '#/runs' + qs(v); });
    f.elements.pipe.value = cur.pipe; f.elements.agent.value = cur.agent; f.elements.status.value = cur.status;
    view.append(f);
    view.append(pagedTable(['Run', 'Agent', 'Status', 'Trigger', 'Scheduled', 'Started', ''], async (cursor) => {
      const page = await api('GET', '/api/v1/runs' + qs({ ...cur, limit: 100, cursor }));
      return { rows: page.runs.map(runRow), next: page.next_cursor };
    }));
  };

  function runDetails(r) {
    const dur = r.duration_ms ? (r.duration_ms / 1000).toFixed(1) + ' s' : '—';
    return el('div', {}, table(['Field', 'Value'], [
      row('Pipe', link('#/pipe/' + enc(r.pipe), r.pipe + ' v' + r.pipe_version)), row('Agent', link('#/agent/' + enc(r.agent_id), r.agent_id)),
      row('Status', el('span', { id: 'run-status' }, status(r.status))), row('Reason', r.reason || r.error || '—'), row('Attempts', r.attempts),
      row('Exit', r.exit_code + (r.signal ? ' (' + r.signal + ')' : '')), row('Trigger', r.trigger + (r.request_id ? ' (request ' + r.request_id + ')' : '')),
      row('Scheduled at', fmtTime(r.scheduled_at)), row('Started', fmtTime(r.started_at)), row('Finished', fmtTime(r.finished_at)), row('Duration', dur),
      row('Log', r.log_chunks + ' chunks, ' + r.log_bytes + ' bytes' + (r.log_truncated ? ' (truncated)' : '')),
    ]), runTelemetry(r));
  }

  // What the run wrote to $DROVER_OUTPUT and $DROVER_METRICS, and what the
  // runner or the server cut from it.
  function runTelemetry(r) {
    const out = el('div', { id: 'telemetry' });
    if (!r.output && !(r.metrics || []).length && !(r.telemetry_notes || []).length) return out;
    out.append(el('h2', { text: 'Telemetry' }));
    if (r.output) out.append(el('h3', { text: 'Output' }), el('pre', { id: 'run-output', text: r.output }));
    if ((r.metrics || []).length) {
      out.append(el('h3', { text: 'Metrics' }), table(['Metric', 'Labels', 'Value', 'Type'], r.metrics.map((m) =>
        el('tr', { 'data-metric': m.name }, el('td', { text: m.name }), el('td', {}, tags(m.labels)), el('td', { text: String(m.value) }), el('td', { text: m.type || '' })))));
    }
    if ((r.telemetry_notes || []).length) out.append(el('h3', { text: 'Notes' }), el('ul', { id: 'telemetry-notes' }, r.telemetry_notes.map((n) => el('li', { text: n }))));
    return out;
  }

  views.run = async (view, g, params, id) => {
    const r = await api('GET', '/api/v1/runs/' + enc(id));
    if (g !== gen) return;
    view.append(el('h1', { text: 'Run ' + r.id }));
    const details = el('div', {}, runDetails(r));
    const controls = el('div', { class: 'toolbar' });
    if ((r.status === 'running' || r.status === 'pending') && can('operator')) {
      controls.append(el('button', { type: 'button', class: 'danger', id: 'cancel-run', text: 'Cancel run', onclick: async (ev) => {
        try { await api('POST', '/api/v1/runs/' + enc(id) + '/cancel'); ev.target.replaceWith(msg('cancel sent', '')); } catch (e) { controls.append(errorBox(e)); }
      } }));
    }
    const state = el('p', { class: 'muted', id: 'log-state' });
    const log = el('pre', { id: 'log' });
    view.append(details, controls, el('h2', { text: 'Log' }), state, log);
    if (r.status === 'running' || r.status === 'pending') {
      state.textContent = 'live';
      const es = new EventSource('/api/v1/runs/' + enc(id) + '/logs/stream');
      live = es;
      es.addEventListener('chunk', (ev) => { const c = JSON.parse(ev.data); log.append(document.createTextNode(logText(c.data))); });
      es.addEventListener('end', (ev) => {
        es.close();
        state.textContent = 'ended';
        try { details.replaceChildren(runDetails(JSON.parse(ev.data))); } catch (e) { /* keep the old details */ }
      });
      es.onerror = () => { if (es.readyState === EventSource.CLOSED) state.textContent = 'disconnected'; };
    } else {
      const logs = await api('GET', '/api/v1/runs/' + enc(id) + '/logs');
      if (g !== gen) return;
      for (const c of logs.chunks || []) log.append(document.createTextNode(logText(c.data)));
      state.textContent = logs.truncated ? 'truncated' : 'complete';
    }
  };

  views.agents = async (view, g, params) => {
    view.append(el('h1', { text: 'Agents' }));
    const cur = { status: params.get('status') || '', tag: params.get('tag') || '' };
    const f = filterForm([['status', 'status', ['online', 'offline', 'revoked']], ['tag', 'tag key=value']], (v) => { location.hash = '#/agents' + qs(v); });
    f.elements.status.value = cur.status; f.elements.tag.value = cur.tag;
    view.append(f);
    view.append(pagedTable(['Agent', 'State', 'Version', 'Backend', 'Applied serial', 'Manifest', 'Last seen', 'Tags'], async (cursor) => {
      const page = await api('GET', '/api/v1/agents' + qs({ status: cur.status, tag: cur.tag ? cur.tag.split(/[\s,]+/) : [], limit: 100, cursor }));
      return {
        rows: page.agents.map((a) => el('tr', { 'data-agent': a.id }, el('td', {}, link('#/agent/' + enc(a.id), a.name || a.hostname || a.id), el('br'), el('span', { class: 'muted', text: a.hostname })),
          el('td', {}, status(a.revoked ? 'revoked' : a.online ? 'online' : 'offline')), el('td', { text: a.agent_version }), el('td', { text: [a.backend, a.scope].filter(Boolean).join(' / ') }),
          el('td', { text: a.applied_serial + (a.manifest ? ' / ' + a.manifest.serial : '') }), el('td', { text: (a.manifest_state || '—') + (a.manifest_expired ? ' (expired)' : '') }),
          el('td', { text: ago(a.last_seen_at) }), el('td', {}, tags(a.tags)))),
        next: page.next_cursor,
      };
    }));
  };

  views.agent = async (view, g, params, id) => {
    const a = await api('GET', '/api/v1/agents/' + enc(id));
    if (g !== gen) return;
    view.append(el('h1', { text: 'Agent ' + (a.name || a.hostname || a.id) }));
    view.append(table(['Field', 'Value'], [
      row('ID', a.id), row('Hostname', a.hostname + (a.reported_hostname && a.reported_hostname !== a.hostname ? ' (reports ' + a.reported_hostname + ')' : '')),
      row('State', status(a.revoked ? 'revoked' : a.online ? 'online' : 'offline')), row('Last seen', fmtTime(a.last_seen_at)),
      row('Version', a.agent_version + ' ' + a.os + '/' + a.arch), row('Backend', [a.backend, a.scope, a.systemd_version].filter(Boolean).join(' / ') || '—'),
      row('Manifest', a.manifest ? 'serial ' + a.manifest.serial + ', expires ' + fmtTime(a.manifest.expires_at) : '—'),
      row('Accepted / applied serial', a.accepted_serial + ' / ' + a.applied_serial), row('Manifest state', (a.manifest_state || '—') + (a.manifest_error ? ': ' + a.manifest_error : '') + (a.manifest_expired ? ' (expired)' : '')),
      row('Identity', a.identity_conflicts > 0 ? a.identity_conflicts + ' conflicts, last from machine ' + (a.identity_conflict_machine || '?') : 'ok'),
      row('Certificate expires', fmtTime(a.cert_expires_at)), row('Tags', tags(a.tags)),
    ]));
    if (can('admin')) {
      const ta = el('input', { id: 'tags-input', 'aria-label': 'tags', size: 60, value: Object.entries(a.tags || {}).map(([k, v]) => k + '=' + v).join(' ') });
      const out = el('span', {});
      const f = el('form', { class: 'inline', id: 'tags-form' }, el('strong', { text: 'Tags' }), ta, el('button', { type: 'submit', text: 'Save tags' }), out);
      f.addEventListener('submit', async (ev) => {
        ev.preventDefault();
        try { await api('PUT', '/api/v1/agents/' + enc(id) + '/tags', { tags: parseTags(ta.value) }); render(); } catch (e) { out.replaceChildren(errorBox(e)); }
      });
      view.append(f, el('div', { class: 'toolbar' },
        a.revoked ? null : confirmButton('Revoke', async () => { await api('POST', '/api/v1/agents/' + enc(id) + '/revoke'); render(); }),
        confirmButton('Delete', async () => { await api('DELETE', '/api/v1/agents/' + enc(id)); location.hash = '#/agents'; })));
    }
    view.append(el('h2', { text: 'Pipes' }));
    view.append((a.pipes || []).length === 0 ? msg('No pipes.') : table(['Pipe', 'Version', 'Next fire', 'Apply error'],
      a.pipes.map((ps) => row(link('#/pipe/' + enc(ps.name), ps.name), 'v' + ps.version, (ps.next_fire_times || []).slice(0, 3).map((t) => [fmtTime(t), el('br')]), ps.apply_error || ''))));
    view.append(el('h2', { text: 'Recent runs' }));
    view.append(pagedTable(['Run', 'Agent', 'Status', 'Trigger', 'Scheduled', 'Started', ''], async (cursor) => {
      const page = await api('GET', '/api/v1/runs' + qs({ agent: id, limit: 20, cursor }));
      return { rows: page.runs.map(runRow), next: page.next_cursor };
    }));
  };

  views.audit = async (view, g, params) => {
    view.append(el('h1', { text: 'Audit log' }));
    const cur = { actor: params.get('actor') || '', action: params.get('action') || '', target: params.get('target') || '' };
    const f = filterForm([['actor', 'actor'], ['action', 'action'], ['target', 'target']], (v) => { location.hash = '#/audit' + qs(v); });
    for (const k of Object.keys(cur)) f.elements[k].value = cur[k];
    view.append(f, pagedTable(['At', 'Actor', 'Role', 'Action', 'Target', 'Source'], async (cursor) => {
      const page = await api('GET', '/api/v1/audit' + qs({ ...cur, limit: 100, cursor }));
      return { rows: page.entries.map((e) => row(fmtTime(e.at), e.actor + ' (' + e.actor_id + ')', e.role, e.action, e.target, e.source || '')), next: page.next_cursor };
    }));
  };

  views.events = async (view, g, params) => {
    view.append(el('h1', { text: 'Events' }));
    const cur = { kind: params.get('kind') || '', pipe: params.get('pipe') || '', agent: params.get('agent') || '' };
    const f = filterForm([['kind', 'kind, e.g. run.failed'], ['pipe', 'pipe'], ['agent', 'agent id']], (v) => { location.hash = '#/events' + qs(v); });
    for (const k of Object.keys(cur)) f.elements[k].value = cur[k];
    view.append(f, pagedTable(['At', 'Kind', 'Pipe', 'Agent', 'Run', 'Message'], async (cursor) => {
      const page = await api('GET', '/api/v1/events' + qs({ ...cur, limit: 100, cursor }));
      return {
        rows: page.events.map((e) => row(fmtTime(e.at), e.kind, e.pipe ? link('#/pipe/' + enc(e.pipe), e.pipe) : '', e.agent ? link('#/agent/' + enc(e.agent), e.agent) : '',
          e.run_id ? link('#/run/' + enc(e.run_id), e.run_id) : '', e.message || '')),
        next: page.next_cursor,
      };
    }));
  };

  // Notification channels (never their secrets), their delivery status, and
  // the rules that route events to them. Channels and rules are written with
  // droverctl notify apply (YAML beside the pipes); here admins test and delete.
  views.notify = async (view) => {
    view.append(el('h1', { text: 'Notifications' }));
    const [chs, st, rules] = await Promise.all([
      api('GET', '/api/v1/notify/channels'), api('GET', '/api/v1/notify/status'), api('GET', '/api/v1/notify/rules')]);
    const byName = {};
    for (const c of st.channels || []) byName[c.channel] = c;
    const out = el('div', {});
    const actions = (c) => can('admin') ? el('span', {},
      el('button', { type: 'button', text: 'Send test', 'data-test-channel': c.name, onclick: async () => {
        try {
          const r = await api('POST', '/api/v1/notify/channels/' + enc(c.name) + '/test');
          out.replaceChildren(r.ok ? msg('Test notification delivered to ' + c.name + '.', 'ok') : errorBox(new Error(c.name + ': ' + r.error)));
        } catch (e) { out.replaceChildren(errorBox(e)); }
      } }),
      confirmButton('Delete', async () => { await api('DELETE', '/api/v1/notify/channels/' + enc(c.name)); render(); })) : '';
    view.append(el('h2', { text: 'Channels' }), out, (chs.channels || []).length === 0 ? msg('No channels. Write them with droverctl notify apply -f.') :
      table(['Name', 'Kind', 'URL', 'Signed', 'Pending', 'Delivered', 'Given up', 'Last delivered', 'Last error', ''],
        chs.channels.map((c) => {
          const s = byName[c.name] || {};
          return el('tr', { 'data-channel': c.name }, [c.name, c.kind, c.url, c.has_secret ? 'yes' : 'no', String(s.pending || 0), String(s.delivered || 0),
            String(s.failed || 0), ago(s.last_delivered_at), s.last_error || ''].map((t) => el('td', { text: t })), el('td', {}, actions(c)));
        })));
    view.append(el('h2', { text: 'Rules' }), (rules.rules || []).length === 0 ? msg('No rules.') :
      table(['Name', 'Events', 'Pipes', 'Tags', 'Channels', 'Severity', ''], rules.rules.map((r) => el('tr', { 'data-rule': r.name },
        el('td', { text: r.name }), el('td', { text: (r.kinds || []).join(', ') }), el('td', { text: (r.pipes || []).join(', ') || 'all' }),
        el('td', {}, tags(r.tags)), el('td', { text: (r.channels || []).join(', ') }), el('td', { text: r.severity || '' }),
        el('td', {}, can('admin') ? confirmButton('Delete', async () => { await api('DELETE', '/api/v1/notify/rules/' + enc(r.name)); render(); }) : '')))));
  };

  function secretBox(label, secret) {
    return el('div', { class: 'card', id: 'new-secret' }, el('strong', { text: label + ' (shown once; copy it now):' }), el('div', { class: 'secret', text: secret }));
  }

  views.tokens = async (view) => {
    view.append(el('h1', { text: 'Tokens' }));
    if (!can('admin')) { view.append(msg('Tokens need the admin role.')); return; }
    const out = el('div', {});
    const name = el('input', { id: 'api-token-name', placeholder: 'name', 'aria-label': 'name', required: true });
    const rl = el('select', { id: 'api-token-role', 'aria-label': 'role' }, ['viewer', 'operator', 'admin'].map((r) => el('option', { value: r, text: r })));
    const ttl = el('input', { placeholder: 'ttl, e.g. 720h (empty: never)', 'aria-label': 'ttl' });
    const f = el('form', { class: 'inline', id: 'api-token-form' }, el('strong', { text: 'New API token' }), name, rl, ttl, el('button', { type: 'submit', class: 'primary', text: 'Create' }));
    f.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      try {
        const t = await api('POST', '/api/v1/api-tokens', { name: name.value.trim(), role: rl.value, ttl: ttl.value.trim() });
        render().then(() => $('view').prepend(secretBox('API token ' + t.name, t.token)));
      } catch (e) { out.replaceChildren(errorBox(e)); }
    });
    view.append(el('h2', { text: 'API tokens' }), f, out, pagedTable(['ID', 'Name', 'Role', 'Created', 'Expires', 'Last used', 'State', ''], async (cursor) => {
      const page = await api('GET', '/api/v1/api-tokens' + qs({ limit: 100, cursor }));
      return {
        rows: page.tokens.map((t) => el('tr', { 'data-token': t.id }, el('td', { text: t.id }), el('td', { text: t.name }), el('td', { text: t.role }), el('td', { text: fmtTime(t.created_at) }),
          el('td', { text: t.expires_at ? fmtTime(t.expires_at) : 'never' }), el('td', { text: ago(t.last_used_at) }), el('td', { text: t.revoked_at ? 'revoked' : 'valid' }),
          el('td', {}, t.revoked_at ? '' : confirmButton('Revoke', async () => { await api('DELETE', '/api/v1/api-tokens/' + enc(t.id)); render(); })))),
        next: page.next_cursor,
      };
    }));
    const eout = el('div', {});
    const ename = el('input', { placeholder: 'name', 'aria-label': 'enrollment token name' });
    const ettl = el('input', { placeholder: 'ttl, e.g. 24h', 'aria-label': 'enrollment token ttl' });
    const etags = el('input', { placeholder: 'tags key=value', 'aria-label': 'enrollment token tags' });
    const ef = el('form', { class: 'inline', id: 'enroll-token-form' }, el('strong', { text: 'New enrollment token' }), ename, ettl, etags, el('button', { type: 'submit', class: 'primary', text: 'Create' }));
    ef.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      try {
        const t = await api('POST', '/api/v1/enrollment-tokens', { name: ename.value.trim(), ttl: ettl.value.trim(), tags: parseTags(etags.value) });
        render().then(() => $('view').prepend(secretBox('Enrollment token ' + (t.name || t.id), t.token)));
      } catch (e) { eout.replaceChildren(errorBox(e)); }
    });
    view.append(el('h2', { text: 'Enrollment tokens' }), ef, eout, pagedTable(['ID', 'Name', 'Tags', 'Created', 'Expires', 'State', 'Agent', ''], async (cursor) => {
      const page = await api('GET', '/api/v1/enrollment-tokens' + qs({ limit: 100, cursor }));
      return {
        rows: page.tokens.map((t) => row(t.id, t.name || '', tags(t.tags), fmtTime(t.created_at), fmtTime(t.expires_at), t.state, t.agent_id ? link('#/agent/' + enc(t.agent_id), t.agent_id) : '',
          confirmButton('Delete', async () => { await api('DELETE', '/api/v1/enrollment-tokens/' + enc(t.id)); render(); }))),
        next: page.next_cursor,
      };
    }));
  };

  // ---- router and session ----
  async function render() {
    const g = ++gen;
    if (live) { live.close(); live = null; }
    const view = $('view');
    view.replaceChildren();
    view.removeAttribute('data-ready');
    if (!me) return;
    const hash = location.hash.replace(/^#\/?/, '') || 'fleet';
    const [pathPart, query] = hash.split('?');
    const [name, ...rest] = pathPart.split('/');
    const fn = views[name] || views.fleet;
    for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.getAttribute('href') === '#/' + name);
    document.title = 'Drover · ' + name;
    view.setAttribute('data-view', views[name] ? name : 'fleet');
    try {
      await fn(view, g, new URLSearchParams(query || ''), rest.map(decodeURIComponent).join('/'));
    } catch (e) {
      if (g === gen) view.append(errorBox(e));
    }
    if (g === gen) view.setAttribute('data-ready', 'true');
  }

  function showLogin() {
    me = null;
    $('login').hidden = false;
    $('nav').hidden = true;
    $('logout').hidden = true;
    $('who').textContent = '';
    $('view').replaceChildren();
  }

  function loggedIn(s) {
    me = s;
    $('login').hidden = true;
    $('nav').hidden = false;
    $('logout').hidden = false;
    $('who').textContent = s.name + ' · ' + s.role;
    $('who').setAttribute('data-role', s.role);
    for (const a of document.querySelectorAll('[data-min-role]')) a.hidden = !can(a.getAttribute('data-min-role'));
    render();
  }

  document.addEventListener('DOMContentLoaded', async () => {
    $('login-form').addEventListener('submit', async (ev) => {
      ev.preventDefault();
      $('login-error').textContent = '';
      try {
        const s = await api('POST', '/ui/login', { token: $('token').value });
        $('token').value = '';
        loggedIn(s);
      } catch (e) { $('login-error').textContent = e.message; }
    });
    $('logout').addEventListener('click', async () => {
      try { await api('POST', '/ui/logout'); } catch (e) { /* the session is gone either way */ }
      showLogin();
    });
    window.addEventListener('hashchange', render);
    try {
      const s = await api('GET', '/ui/session');
      if (s) loggedIn(s); else showLogin();
    } catch (e) { showLogin(); }
  });
}());
