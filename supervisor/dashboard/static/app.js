// The dashboard's one script. No framework and no build step: the daemon serves this file as is.
//
// Safety: every text that comes from the daemon (and so from a server: names, descriptions,
// schemas, log lines, errors) becomes a DOM text node or an attribute value, never markup; the
// page's Content Security Policy allows no inline script besides.
//
// Data: the control methods over POST /dashboard/rpc, and one event stream (/dashboard/events)
// that sends the status whenever it changes (and, on a server's page, its log tail).
"use strict";

const main = document.getElementById("main");
const notice = document.getElementById("notice");
const connection = document.getElementById("connection");

const view = {
  status: null, // the last "status" result
  session: { read_only: true },
  logs: null, // { name, lines } of the page's server
  events: null, // the EventSource
  streamFor: undefined, // whose logs the stream carries
  page: null, // the route rendered last
  tools: null, // the tools of the server shown, and what they were fetched for
  toolsKey: "",
  explain: null,
  reloadErrors: null,
  health: null,
  recent: null,
  clients: null,
};

// ---- building the DOM -------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function replace(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

/** Re-render *region* with *build*, keeping keyboard focus on the control that had it. */
function rerender(region, build) {
  const focused = document.activeElement && region.contains(document.activeElement)
    ? document.activeElement.getAttribute("data-key") : null;
  replace(region, build());
  if (focused) {
    const again = [...region.querySelectorAll("[data-key]")].find((el) => el.getAttribute("data-key") === focused);
    if (again) again.focus();
  }
}

function say(text, bad = false) {
  notice.textContent = text;
  notice.classList.toggle("bad", bad);
  clearTimeout(say.timer);
  say.timer = setTimeout(() => { notice.textContent = ""; }, bad ? 15000 : 5000);
}

// ---- talking to the daemon --------------------------------------------------------------------

let requestIds = 0;

async function rpc(method, params = {}) {
  const response = await fetch("/dashboard/rpc", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: ++requestIds, method, params }),
    credentials: "same-origin",
  });
  if (response.status === 401) {
    location.reload(); // the session ended: the page says how to get a new one
    throw new Error("signed out");
  }
  if (!response.ok) throw new Error(await response.text());
  const reply = await response.json();
  if (reply.error) {
    const error = new Error(reply.error.message);
    error.data = reply.error.data;
    throw error;
  }
  return reply.result;
}

function listen() {
  const route = currentRoute();
  const logsOf = route.page === "ext" ? route.name : null;
  if (view.events && view.streamFor === logsOf) return;
  if (view.events) view.events.close();
  view.streamFor = logsOf;
  view.logs = null;
  const url = "/dashboard/events" + (logsOf ? "?logs=" + encodeURIComponent(logsOf) : "");
  const events = new EventSource(url);
  view.events = events;
  events.addEventListener("open", () => { connection.textContent = "live"; });
  events.addEventListener("error", () => {
    if (events.readyState === EventSource.CLOSED) location.reload(); // refused (401, 404): say why
    else connection.textContent = "reconnecting…";
  });
  events.addEventListener("session", (event) => {
    view.session = JSON.parse(event.data);
    document.body.classList.toggle("read-only", view.session.read_only);
    render();
  });
  events.addEventListener("status", (event) => {
    const reply = JSON.parse(event.data);
    if (reply.result) {
      view.status = reply.result;
      render();
    }
  });
  events.addEventListener("logs", (event) => {
    view.logs = JSON.parse(event.data);
    renderLogs();
  });
  events.addEventListener("ended", () => {
    events.close();
    location.reload();
  });
}

async function act(method, params, done) {
  try {
    const result = await rpc(method, params);
    if (done) say(done(result));
    return result;
  } catch (error) {
    say(`${method} failed: ${error.message}`, true);
    return null;
  }
}

// ---- formatting -------------------------------------------------------------------------------

function duration(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return "";
  const units = [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];
  const parts = [];
  let rest = Math.floor(seconds);
  for (const [unit, size] of units) {
    if (rest >= size || (unit === "s" && parts.length === 0)) {
      parts.push(`${Math.floor(rest / size)}${unit}`);
      rest %= size;
    }
    if (parts.length === 2) break;
  }
  return parts.join(" ");
}

function since(iso) {
  return duration((Date.now() - Date.parse(iso)) / 1000);
}

function bytes(count) {
  if (!count) return "";
  const mib = count / 1048576;
  return mib >= 1024 ? `${(mib / 1024).toFixed(1)} GiB` : `${mib.toFixed(mib < 10 ? 1 : 0)} MiB`;
}

function cpu(resources) {
  return resources && resources.cpu_seconds ? `${resources.cpu_seconds.toFixed(1)} s` : "";
}

function sandboxLevel(sandbox) {
  if (!sandbox) return "";
  if (sandbox.mode !== "confined") return sandbox.mode;
  const lacks = sandbox.lacks && sandbox.lacks.length ? `, lacks ${sandbox.lacks.join(", ")}` : "";
  return `${sandbox.confined || "confined"}${lacks}`;
}

function stateBadge(record) {
  const detail = record.detail ? ` (${record.detail})` : "";
  return h("span", { class: "state", "data-state": record.state }, record.state + detail);
}

function td(label, ...content) {
  return h("td", { "data-label": label }, ...content);
}

// ---- the pages --------------------------------------------------------------------------------

function currentRoute() {
  const hash = location.hash || "#/";
  if (hash.startsWith("#/ext/")) return { page: "ext", name: decodeURIComponent(hash.slice(6)) };
  if (hash === "#/daemon") return { page: "daemon" };
  if (hash === "#/clients") return { page: "clients" };
  return { page: "host" };
}

function actions(record) {
  const name = record.name;
  const busy = ["starting", "stopping"].includes(record.state);
  const running = !["stopped", "failed"].includes(record.state);
  if (view.session.read_only) return h("span", { class: "muted" }, "read-only");
  // aria-disabled, not disabled: a disabled button drops the keyboard focus as the state moves on
  const button = (verb, label, off, attrs) => h("button", {
    type: "button",
    "data-key": `${verb}:${name}`,
    "aria-label": `${label} ${name}`,
    "aria-disabled": off ? "true" : null,
    onclick: () => { if (!off) control(verb, record); },
    ...attrs,
  }, label);
  return h("div", { class: "actions" },
    button("start", "Start", running || busy),
    button("stop", "Stop", !running || record.state === "stopping", { class: "danger" }),
    button("restart", "Restart", record.state === "stopping"));
}

async function control(verb, record) {
  const current = findRecord(record.name) || record;
  if (verb === "stop" && current.in_flight > 0) {
    const calls = current.in_flight === 1 ? "1 call" : `${current.in_flight} calls`;
    if (!confirm(`${record.name} is serving ${calls}. Stop it anyway? Those calls will fail.`)) return;
  }
  await act(verb, { name: record.name, wait: false }, () => `${verb}: ${record.name}`);
}

function findRecord(name) {
  return view.status ? view.status.extensions.find((r) => r.name === name) : null;
}

function renderHost() {
  const records = view.status ? view.status.extensions : [];
  const rows = records.map((record) => h("tr", { "data-name": record.name },
    td("Server", h("a", { href: "#/ext/" + encodeURIComponent(record.name), "data-key": `open:${record.name}` }, record.name)),
    td("State", stateBadge(record)),
    td("Uptime", record.state === "running" ? since(record.since) : ""),
    td("Restarts", String(record.restarts)),
    td("Tools", String(record.tools), record.tools_changed && record.tools_changed.length
      ? h("span", { class: "changed" }, ` (${record.tools_changed.length} changed)`) : null),
    td("Calls", String(record.in_flight)),
    td("RSS", bytes(record.resources && record.resources.rss_bytes)),
    td("CPU", cpu(record.resources)),
    td("Sandbox", sandboxLevel(record.sandbox)),
    td("Last error", record.last_error ? h("span", { class: "error" }, record.last_error) : ""),
    td("Actions", actions(record))));
  return h("section", { "aria-labelledby": "servers-title" },
    h("h1", { id: "servers-title" }, "Servers"),
    records.length === 0 && view.status ? h("p", { class: "muted" }, "No servers are configured.") : null,
    h("table", {},
      h("thead", {}, h("tr", {}, ["Server", "State", "Uptime", "Restarts", "Tools", "Calls", "RSS", "CPU",
        "Sandbox", "Last error", "Actions"].map((title) => h("th", { scope: "col" }, title)))),
      h("tbody", {}, rows)));
}

function renderExtension(name) {
  const record = findRecord(name);
  if (!record) {
    return h("p", { class: view.status ? "error" : "muted" }, view.status ? "No such server in this config." : "Loading…");
  }
  const facts = [
    ["State", stateBadge(record)],
    ["Since", new Date(record.since).toLocaleString()],
    ["Restarts", String(record.restarts)],
    ["Calls in flight", String(record.in_flight)],
    ["Tools", String(record.tools)],
    ["RSS", bytes(record.resources && record.resources.rss_bytes)],
    ["CPU", cpu(record.resources)],
    ["PID", record.pid ? String(record.pid) : ""],
    ["Sandbox", sandboxLevel(record.sandbox)],
  ];
  if (record.remote) {
    facts.push(["URL", record.remote.url || ""]);
    if (record.remote.login) facts.push(["Login", loginText(record.remote.login)]);
  }
  if (record.last_error) facts.push(["Last error", h("span", { class: "error" }, record.last_error)]);
  if (record.last_stderr) facts.push(["Last stderr line", h("code", {}, record.last_stderr)]);
  return [
    h("section", { "aria-label": "Actions" }, actions(record), remoteActions(record)),
    h("dl", { class: "facts" }, facts.map(([term, value]) => [h("dt", {}, term), h("dd", {}, value)])),
    record.instances && record.instances.length ? renderInstances(record) : null,
  ];
}

/** The page of one server: its summary follows the status; log, tools and grants fill in alone. */
function extensionPage(name) {
  return h("div", {},
    h("p", {}, h("a", { href: "#/" }, "← All servers")),
    h("h1", {}, name),
    h("div", { id: "summary" }),
    h("h2", { id: "log-title" }, "Log"),
    h("div", { id: "logs", "aria-labelledby": "log-title" }),
    h("h2", {}, "Tools"),
    h("div", { id: "tools" }),
    h("h2", {}, "Sandbox grants"),
    h("div", { id: "explain" }));
}

function loginText(login) {
  if (!login.logged_in) return "not logged in";
  const left = login.expires_in !== undefined && login.expires_in !== null ? `, token ${duration(login.expires_in)} left` : "";
  return `logged in${left}${login.refreshable ? ", refreshable" : ""}`;
}

function remoteActions(record) {
  if (!record.remote || view.session.read_only) return null;
  return h("div", { class: "actions" },
    h("button", { type: "button", "data-key": `login:${record.name}`, onclick: () => logIn(record.name) }, "Log in"),
    h("button", { type: "button", "data-key": `logout:${record.name}`, onclick: () => act("logout", { name: record.name }, () => `logged out of ${record.name}`) }, "Log out"));
}

async function logIn(name) {
  const begun = await act("login", { name });
  if (begun && begun.url) {
    window.open(begun.url, "_blank", "noopener,noreferrer");
    say(begun.user_code ? `Enter the code ${begun.user_code} at the page that opened.` : "Log in at the page that opened.");
  }
}

function renderInstances(record) {
  return [h("h2", {}, "Per-client instances"),
    h("table", {},
      h("thead", {}, h("tr", {}, ["PID", "State", "Since", "Calls", "Restarts", "RSS"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, record.instances.map((instance) => h("tr", {},
        td("PID", instance.pid ? String(instance.pid) : ""),
        td("State", stateBadge(instance)),
        td("Since", since(instance.since)),
        td("Calls", String(instance.in_flight)),
        td("Restarts", String(instance.restarts)),
        td("RSS", bytes(instance.resources && instance.resources.rss_bytes))))))];
}

function renderLogs() {
  const region = document.getElementById("logs");
  if (!region) return;
  const logs = view.logs;
  if (!logs) {
    replace(region, h("p", { class: "muted" }, "Loading…"));
    return;
  }
  if (logs.error) {
    replace(region, h("p", { class: "error" }, logs.error));
    return;
  }
  const old = region.querySelector("pre");
  const atEnd = !old || old.scrollTop + old.clientHeight >= old.scrollHeight - 4;
  const pre = h("pre", { tabindex: "0", "aria-label": "the server's last stderr lines" },
    logs.lines.length ? logs.lines.join("\n") : "(nothing written to stderr yet)");
  replace(region, pre);
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

async function loadTools(name, record) {
  const key = `${name}:${record.tools}:${JSON.stringify(record.tools_changed || [])}:${record.state}`;
  if (view.toolsKey === key) return;
  view.toolsKey = key;
  try {
    const result = await rpc("tools", { name });
    view.tools = { name, tools: result.tools };
  } catch (error) {
    view.tools = { name, error: error.message };
  }
  renderTools();
}

function renderTools() {
  const region = document.getElementById("tools");
  if (!region || !view.tools) return;
  if (view.tools.error) {
    replace(region, h("p", { class: "error" }, view.tools.error));
    return;
  }
  const changed = view.tools.tools.filter((tool) => tool.changed);
  const name = view.tools.name;
  const open = [...region.querySelectorAll("details[open]")].map((d) => d.getAttribute("data-tool"));
  rerender(region, () => [
    changed.length && !view.session.read_only
      ? h("p", {}, h("button", { type: "button", "data-key": `approve-all:${name}`, onclick: () => approve(name, null) },
        `Approve all ${changed.length} changed`)) : null,
    view.tools.tools.length === 0 ? h("p", { class: "muted" }, "No tools listed.") : null,
    view.tools.tools.map((tool) => renderTool(name, tool)),
  ]);
  for (const details of region.querySelectorAll("details")) {
    if (open.includes(details.getAttribute("data-tool"))) details.open = true;
  }
}

function renderTool(extension, tool) {
  const change = tool.changed;
  const schema = JSON.stringify(tool.inputSchema, null, 2);
  return h("details", { "data-tool": tool.name, open: change ? true : null },
    h("summary", {}, h("code", {}, tool.exposed || tool.name),
      tool.title ? ` ${tool.title}` : "",
      change ? h("span", { class: "changed" }, ` changed: ${change.parts.join(", ")}${change.held ? " (held)" : ""}`) : null),
    tool.description ? h("p", { class: "tool-description" }, tool.description) : null,
    change ? h("p", {}, changeText(change)) : null,
    change ? renderDiff(change) : null,
    h("p", { class: "muted" }, change ? "Its input schema now:" : "Input schema:"),
    h("pre", {}, schema),
    change && !view.session.read_only
      ? h("button", { type: "button", "data-key": `approve:${extension}:${tool.name}`, onclick: () => approve(extension, tool.name) }, `Approve ${tool.name}`)
      : null);
}

function changeText(change) {
  const parts = change.parts.join(", ");
  const verb = change.parts.length === 1 ? "differs" : "differ";
  const when = change.since ? ` since ${new Date(change.since).toLocaleString()}` : "";
  const held = change.held ? " Clients neither see nor call it until it is approved." : "";
  return `Its ${parts} ${verb} from the definition pinned${when}.${held}`;
}

function asText(value) {
  if (value === undefined) return [];
  return (typeof value === "string" ? value : JSON.stringify(value, null, 2)).split("\n");
}

/** Lines of *before* and *after* as removed, added and kept, by their longest common subsequence. */
function lineDiff(before, after) {
  const n = before.length;
  const m = after.length;
  if (n * m > 1000000) return [...before.map((l) => ["-", l]), ...after.map((l) => ["+", l])];
  const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      lcs[i][j] = before[i] === after[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && before[i] === after[j]) { out.push([" ", before[i]]); i++; j++; }
    else if (i < n && (j === m || lcs[i + 1][j] >= lcs[i][j + 1])) { out.push(["-", before[i]]); i++; }
    else { out.push(["+", after[j]]); j++; }
  }
  return out;
}

function renderDiff(change) {
  if (!change.pinned || !change.now) {
    return h("p", { class: "muted" },
      "The pinned text is not known (pinned by an older daemon, or over 8 KiB): only its hash differs.");
  }
  return change.parts.map((part) => h("figure", { class: "diff" },
    h("figcaption", {}, `${part}: pinned (−) and now (+)`),
    h("pre", {}, lineDiff(asText(change.pinned[part]), asText(change.now[part])).map(([mark, line]) =>
      h("span", { class: mark === "+" ? "ins" : mark === "-" ? "del" : "same" }, `${mark} ${line}\n`)))));
}

async function approve(extension, tool) {
  const approved = await act("approve", tool ? { name: extension, tool } : { name: extension },
    (result) => `approved: ${result.approved.join(", ") || "nothing"}`);
  if (approved) {
    view.toolsKey = "";
    const record = findRecord(extension);
    if (record) await loadTools(extension, { ...record, tools_changed: [] });
  }
}

async function loadExplain(name) {
  if (view.explain && view.explain.name === name) return;
  view.explain = { name, lines: null };
  try {
    view.explain.lines = (await rpc("explain", { name })).lines;
  } catch (error) {
    view.explain.error = error.message;
  }
  renderExplain();
}

function renderExplain() {
  const region = document.getElementById("explain");
  if (!region || !view.explain) return;
  if (view.explain.error) replace(region, h("p", { class: "error" }, view.explain.error));
  else if (view.explain.lines) replace(region, h("pre", {}, view.explain.lines.join("\n")));
  else replace(region, h("p", { class: "muted" }, "Loading…"));
}

function renderDaemon() {
  const health = view.health;
  const process = health ? health.process : null;
  const facts = process ? [
    ["PID", String(process.pid)],
    ["Uptime", duration(process.uptime_s)],
    ["RSS", bytes(process.rss_bytes)],
    ["Threads", `${process.threads} (${process.worker_threads} in the worker pool)`],
    ["Blocking calls", String(process.blocking_calls)],
    ["Tasks", String(process.asyncio_tasks)],
    ["Open files", String(process.open_fds)],
    ["Spool", `${health.spool.files} files, ${bytes(health.spool.bytes) || "0 MiB"}`],
  ] : [];
  return h("div", {},
    h("h1", {}, "Daemon"),
    process ? h("dl", { class: "facts" }, facts.map(([t, v]) => [h("dt", {}, t), h("dd", {}, v)])) : h("p", { class: "muted" }, "Loading…"),
    h("h2", {}, "Config"),
    health && health.config ? h("p", {}, "File: ", h("code", {}, health.config)) : null,
    h("p", {}, "Reload reads the config file again: it starts what was added, stops what was removed and restarts what changed. A config with errors changes nothing."),
    view.session.read_only ? null
      : h("button", { type: "button", "data-key": "reload", onclick: reload }, "Reload the config"),
    view.reloadErrors ? h("div", { role: "alert" },
      h("p", { class: "error" }, view.reloadErrors.message),
      h("ul", { class: "errors" }, view.reloadErrors.errors.map((line) => h("li", { class: "error" }, line)))) : null,
    h("h2", {}, "Calls per server"),
    health ? h("table", { class: "calls" },
      h("thead", {}, h("tr", {}, ["Server", "Calls", "Errors", "In flight", "Calls/s (1 min)", "p50", "p99",
        "Last 5 minutes"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, health.extensions.map((e) => {
        const points = view.recent ? view.recent.extensions[e.name] || [] : [];
        const lastMinute = points.slice(-6);
        const perSecond = lastMinute.reduce((sum, p) => sum + p.calls_per_s, 0) / Math.max(1, lastMinute.length);
        const latest = [...points].reverse().find((p) => p.p50_ms !== null);
        return h("tr", { "data-name": e.name },
          td("Server", e.name), td("Calls", String(e.calls)), td("Errors", String(e.errors)),
          td("In flight", String(e.in_flight)),
          td("Calls/s (1 min)", perSecond.toFixed(2)),
          td("p50", latest ? milliseconds(latest.p50_ms) : ""),
          td("p99", latest ? milliseconds(latest.p99_ms) : ""),
          td("Last 5 minutes", sparkline(e.name, points)));
      }))) : null);
}

function milliseconds(value) {
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value < 10 ? value.toFixed(2) : value.toFixed(0)} ms`;
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  for (const child of children) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return el;
}

/** Calls per second (a line) and p99 latency (a dotted line) over the window, each to its own scale. */
function sparkline(name, points) {
  const width = 150;
  const height = 32;
  const line = (values, cls) => {
    const top = Math.max(...values.map((v) => v || 0), 0);
    if (!points.length || top === 0) return null;
    const step = width / Math.max(1, points.length - 1);
    const coords = values.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - ((v || 0) / top) * (height - 4)).toFixed(1)}`);
    return svg("polyline", { points: coords.join(" "), class: cls, fill: "none" });
  };
  const calls = points.map((p) => p.calls_per_s);
  const p99 = points.map((p) => p.p99_ms);
  const peak = Math.max(0, ...calls);
  const label = `${name}: at most ${peak.toFixed(2)} calls a second over the last 5 minutes`;
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": label, class: "spark" },
    svg("title", {}, label));
  for (const drawn of [line(calls, "spark-calls"), line(p99, "spark-p99")]) if (drawn) chart.append(drawn);
  return chart;
}

async function reload() {
  try {
    const report = await rpc("reload");
    view.reloadErrors = null;
    const changes = ["added", "removed", "restarted"].map((k) => `${report[k].length} ${k}`).join(", ");
    say(`reloaded: ${changes}`);
  } catch (error) {
    view.reloadErrors = { message: error.message, errors: (error.data && error.data.errors) || [] };
  }
  render();
}

function renderClients() {
  const clients = view.clients;
  return h("section", { "aria-labelledby": "clients-title" },
    h("h1", { id: "clients-title" }, "Clients"),
    h("p", { class: "muted" }, "MCP clients connected to the gateway now (mcp.sock and HTTP sessions)."),
    !clients ? h("p", { class: "muted" }, "Loading…")
      : clients.length === 0 ? h("p", {}, "No client is connected.")
        : h("table", {},
          h("thead", {}, h("tr", {}, ["Client", "Version", "Transport", "Protocol", "Profile", "In flight", "Connected"]
            .map((t) => h("th", { scope: "col" }, t)))),
          h("tbody", {}, clients.map((c) => h("tr", {},
            td("Client", c.client || "(unnamed)"),
            td("Version", c.version || ""),
            td("Transport", c.listener === "unix" ? "mcp.sock" : "HTTP"),
            td("Protocol", c.protocol || ""),
            td("Profile", c.profile || "(all)"),
            td("In flight", c.in_flight === null ? "" : String(c.in_flight)),
            td("Connected", `${since(c.since)} ago`))))));
}

async function loadClients() {
  try {
    view.clients = (await rpc("clients")).clients;
  } catch (error) {
    say(`clients failed: ${error.message}`, true);
  }
  if (currentRoute().page === "clients") rerender(main, renderClients);
}

async function loadHealth() {
  try {
    [view.health, view.recent] = await Promise.all([rpc("health"), rpc("recent_calls")]);
  } catch (error) {
    say(`health failed: ${error.message}`, true);
  }
  if (currentRoute().page === "daemon") rerender(main, renderDaemon);
}

function render() {
  const route = currentRoute();
  const key = JSON.stringify(route);
  const entered = view.page !== key;
  view.page = key;
  for (const link of document.querySelectorAll("[data-nav]")) {
    const current = link.getAttribute("data-nav") === (route.page === "ext" ? "host" : route.page);
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (route.page === "host") {
    document.title = "Servers · mcp-supervisor";
    rerender(main, renderHost);
  } else if (route.page === "ext") {
    document.title = `${route.name} · mcp-supervisor`;
    if (entered) {
      view.tools = null;
      view.toolsKey = "";
      view.explain = null;
      replace(main, extensionPage(route.name));
      renderLogs();
    }
    rerender(document.getElementById("summary"), () => renderExtension(route.name));
    const record = findRecord(route.name);
    if (record) {
      loadTools(route.name, record);
      loadExplain(route.name);
    }
  } else if (route.page === "clients") {
    document.title = "Clients · mcp-supervisor";
    if (entered) {
      view.clients = null;
      loadClients();
    }
    rerender(main, renderClients);
  } else {
    document.title = "Daemon · mcp-supervisor";
    if (entered) loadHealth();
    rerender(main, renderDaemon);
  }
  if (entered) main.focus({ preventScroll: true });
}

window.addEventListener("hashchange", () => {
  listen();
  render();
});

document.getElementById("signout").addEventListener("click", async () => {
  await fetch("/dashboard/logout", { method: "POST", credentials: "same-origin" });
  location.reload();
});

setInterval(() => {
  const page = currentRoute().page;
  if (page === "daemon") loadHealth();
  if (page === "clients") loadClients(); // clients come and go without a state change
}, 3000);

listen();
render();
