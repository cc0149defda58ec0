// hearth's chat page. It talks to this server's own API only (same origin):
// GET /v1/models, POST /v1/chat/completions (streamed, with the conversation's
// id as session_id so the server keeps its KV warm), POST /tokenize. Model
// output is never parsed as HTML: the markdown below builds DOM nodes and
// text nodes only.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "hearth.conversations";
const SETTINGS = "hearth.settings";
const KEY = "hearth.apiKey";
const THEME = "hearth.theme";

const state = {
  conversations: [],
  current: null,
  models: [],
  busy: null, // {controller, conv, msg}
  attachments: [], // data: URLs
  draftTimer: 0,
};

// ---- storage ---------------------------------------------------------------

function load(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v == null ? fallback : v;
  } catch (_) {
    return fallback;
  }
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(state.conversations));
  } catch (e) {
    showError("This browser's storage is full: the conversation is not saved (" + e.message + ").");
  }
}

function settings() {
  return load(SETTINGS, {});
}

function newId() {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return "web-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

// ---- the API ---------------------------------------------------------------

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = localStorage.getItem(KEY);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function errorOf(res) {
  let text = "";
  try {
    text = await res.text();
    const j = JSON.parse(text);
    if (j.error) return (j.error.message || JSON.stringify(j.error)) + " (HTTP " + res.status + ")";
  } catch (_) {}
  return "HTTP " + res.status + (text ? ": " + text.slice(0, 300) : "");
}

async function api(path, body, signal) {
  const res = await fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers: headers(),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (res.status === 401) {
    askKey("The server refused the key." + (localStorage.getItem(KEY) ? "" : " It needs one."));
    throw new Error(await errorOf(res));
  }
  if (!res.ok) throw new Error(await errorOf(res));
  return res;
}

async function loadModels() {
  try {
    const res = await api("/v1/models");
    const j = await res.json();
    state.models = j.data || [];
  } catch (e) {
    showError("Could not list the models: " + e.message);
    return;
  }
  const sel = $("model");
  const keep = sel.value || load("hearth.model", "");
  sel.textContent = "";
  for (const m of state.models) {
    const o = document.createElement("option");
    o.value = m.id;
    const st = m.status && m.status.value;
    o.textContent = m.id + (st && st !== "loaded" ? " (" + st + ")" : "");
    sel.appendChild(o);
  }
  const loaded = state.models.find((m) => m.status && m.status.value === "loaded");
  if (state.models.some((m) => m.id === keep)) sel.value = keep;
  else if (loaded) sel.value = loaded.id;
  modelChanged();
}

function currentModel() {
  return state.models.find((m) => m.id === $("model").value);
}

function modelChanged() {
  const m = currentModel();
  localStorage.setItem("hearth.model", $("model").value);
  $("attach-button").hidden = !(m && m.capabilities && m.capabilities.vision);
  updateContext();
}

// ---- conversations -----------------------------------------------------------

function conv() {
  return state.conversations.find((c) => c.id === state.current);
}

function newConversation() {
  if (state.busy) stop();
  const c = { id: newId(), title: "New chat", created: Date.now(), messages: [] };
  state.conversations.unshift(c);
  state.current = c.id;
  save();
  renderAll();
  $("input").focus();
}

function selectConversation(id) {
  if (state.busy && state.busy.conv.id !== id) stop();
  state.current = id;
  localStorage.setItem("hearth.current", id);
  renderAll();
  document.getElementById("app").classList.remove("side-open");
}

function deleteConversation(id) {
  const c = state.conversations.find((x) => x.id === id);
  if (!c || !confirm('Delete "' + c.title + '"?')) return;
  if (state.busy && state.busy.conv.id === id) stop();
  state.conversations = state.conversations.filter((x) => x.id !== id);
  // The server's session goes too (best effort: it is evicted anyway in time).
  fetch("/v1/sessions/" + encodeURIComponent(id), { method: "DELETE", headers: headers() }).catch(() => {});
  if (state.current === id) state.current = state.conversations.length ? state.conversations[0].id : null;
  save();
  renderAll();
}

function renderList() {
  const ul = $("conversations");
  ul.textContent = "";
  for (const c of state.conversations) {
    const li = document.createElement("li");
    li.dataset.id = c.id;
    if (c.id === state.current) li.classList.add("active");
    const t = document.createElement("span");
    t.textContent = c.title;
    li.appendChild(t);
    const del = document.createElement("button");
    del.textContent = "×";
    del.title = "Delete";
    del.setAttribute("aria-label", "Delete " + c.title);
    del.addEventListener("click", (e) => {
      e.stopPropagation();
      deleteConversation(c.id);
    });
    li.appendChild(del);
    li.addEventListener("click", () => selectConversation(c.id));
    ul.appendChild(li);
  }
}

// ---- markdown (DOM nodes only: model output never becomes HTML) ------------

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}

function safeUrl(u) {
  try {
    const url = new URL(u, location.href);
    return ["http:", "https:", "mailto:"].includes(url.protocol) ? url.href : null;
  } catch (_) {
    return null;
  }
}

// Inline spans: `code`, **bold**, *em* / _em_, ~~strike~~, [text](url), <url>.
function inline(text, parent) {
  const re = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|(?<![\w])__([^_]+)__(?![\w])|\*([^*\s][^*]*)\*|(?<![\w])_([^_\s][^_]*)_(?![\w])|~~([^~]+)~~|\[([^\]]+)\]\(([^)\s]+)\)|<(https?:\/\/[^>\s]+)>/g;
  let last = 0;
  let m;
  while ((m = re.exec(text))) {
    if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
    if (m[1]) parent.appendChild(el("code", null, m[2]));
    else if (m[3] || m[4]) inline(m[3] || m[4], parent.appendChild(el("strong")));
    else if (m[5] || m[6]) inline(m[5] || m[6], parent.appendChild(el("em")));
    else if (m[7]) inline(m[7], parent.appendChild(el("del")));
    else {
      const href = safeUrl(m[9] || m[10]);
      if (href) {
        const a = el("a");
        a.href = href;
        a.target = "_blank";
        a.rel = "noopener noreferrer";
        inline(m[8] || m[10], a);
        parent.appendChild(a);
      } else parent.appendChild(document.createTextNode(m[0]));
    }
    last = re.lastIndex;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

function inlineLines(lines, parent) {
  lines.forEach((l, i) => {
    if (i) parent.appendChild(el("br"));
    inline(l, parent);
  });
}

const KEYWORDS = new Set((
  "as async await break case catch class const continue def default del do elif else enum export " +
  "extends false fn for from func function go if impl import in interface is lambda let loop match " +
  "mod mut new nil none null package pass pub raise return self static struct super switch then " +
  "this throw trait true try type typeof use var void where while with yield int float str bool " +
  "char string i32 i64 u8 u32 u64 usize f32 f64 echo fi done esac local"
).split(" "));

// A small highlighter for any language: comments, strings, numbers, keywords.
function highlight(code, lang, parent) {
  const hash = /^(py|python|sh|bash|shell|zsh|rb|ruby|yaml|yml|toml|r|perl|make|makefile|dockerfile)$/i.test(lang);
  const re = hash
    ? /(#[^\n]*)|("""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?)|(\b\d[\d_.xXa-fA-F]*\b)|([A-Za-z_][\w]*)/g
    : /(\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$)|--[^\n]*)|("(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?|`(?:\\.|[^`\\])*`?)|(\b\d[\d_.xXa-fA-F]*\b)|([A-Za-z_][\w]*)/g;
  let last = 0;
  let m;
  while ((m = re.exec(code))) {
    if (m[4] && !KEYWORDS.has(m[4])) continue;
    if (m.index > last) parent.appendChild(document.createTextNode(code.slice(last, m.index)));
    const cls = m[1] ? "tk-com" : m[2] ? "tk-str" : m[3] ? "tk-num" : "tk-kw";
    parent.appendChild(el("span", cls, m[0]));
    last = re.lastIndex;
  }
  if (last < code.length) parent.appendChild(document.createTextNode(code.slice(last)));
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) {
    const t = el("textarea");
    t.value = text;
    document.body.appendChild(t);
    t.select();
    document.execCommand("copy");
    t.remove();
  }
  const was = button.textContent;
  button.textContent = "Copied";
  setTimeout(() => (button.textContent = was), 1200);
}

function codeBlock(code, lang) {
  const wrap = el("div", "codeblock");
  if (lang) wrap.appendChild(el("span", "lang", lang));
  const copy = el("button", "copy", "Copy");
  copy.addEventListener("click", () => copyText(code, copy));
  wrap.appendChild(copy);
  const pre = el("pre");
  const c = el("code");
  highlight(code, lang, c);
  pre.appendChild(c);
  wrap.appendChild(pre);
  return wrap;
}

function markdown(text, parent) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  let para = [];
  const flush = () => {
    if (para.length) inlineLines(para, parent.appendChild(el("p")));
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
    if (fence) {
      flush();
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i++; // the closing fence (absent while a reply is still streaming)
      parent.appendChild(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    const h = line.match(/^(#{1,6})\s+(.*)$/);
    if (h) {
      flush();
      inline(h[2], parent.appendChild(el("h" + Math.min(h[1].length + 1, 6))));
      i++;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      parent.appendChild(el("hr"));
      i++;
      continue;
    }
    if (/^\s*>/.test(line)) {
      flush();
      const q = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) q.push(lines[i++].replace(/^\s*>\s?/, ""));
      markdown(q.join("\n"), parent.appendChild(el("blockquote")));
      continue;
    }
    const li = line.match(/^(\s*)([-*+]|\d+[.)])\s+(.*)$/);
    if (li) {
      flush();
      const ordered = /\d/.test(li[2]);
      const list = parent.appendChild(el(ordered ? "ol" : "ul"));
      if (ordered) list.start = parseInt(li[2], 10);
      while (i < lines.length) {
        const m = lines[i].match(/^(\s*)([-*+]|\d+[.)])\s+(.*)$/);
        if (!m || /\d/.test(m[2]) !== ordered) break;
        const item = [m[3]];
        i++;
        while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !/^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
          item.push(lines[i++].trim());
        }
        inlineLines(item, list.appendChild(el("li")));
      }
      continue;
    }
    if (!line.trim()) {
      flush();
      i++;
      continue;
    }
    para.push(line);
    i++;
  }
  flush();
}

// ---- messages ----------------------------------------------------------------

function fmt(x, digits) {
  return x == null ? "?" : Number(x).toFixed(digits);
}

function statsLine(msg) {
  const s = msg.stats;
  if (!s) return null;
  const parts = [];
  if (s.prompt_tokens != null) {
    parts.push("prompt " + s.prompt_tokens + " tokens, " + (s.cached_tokens || 0) + " reused");
  }
  if (s.timings) {
    if (s.timings.prompt_n > 0) parts.push("prefill " + fmt(s.timings.prompt_per_second, 1) + " tok/s");
    parts.push("decode " + fmt(s.timings.predicted_per_second, 1) + " tok/s");
  }
  if (s.completion_tokens != null) parts.push(s.completion_tokens + " tokens");
  if (s.finish) parts.push("finish: " + s.finish);
  return el("div", "stats", parts.join(" · "));
}

function renderMessage(msg, index, c) {
  const div = el("div", "msg " + msg.role);
  div.dataset.index = index;
  if (msg.role === "user") {
    if (msg.images && msg.images.length) {
      const imgs = el("div", "images");
      for (const src of msg.images) {
        const img = el("img");
        img.src = src;
        img.alt = "attached image";
        imgs.appendChild(img);
      }
      div.appendChild(imgs);
    }
    div.appendChild(el("div", "body", msg.content));
  } else if (msg.role === "tool") {
    const t = el("div", "tool");
    t.appendChild(el("div", "head", "tool result" + (msg.name ? ": " + msg.name : "")));
    const pre = el("pre");
    pre.appendChild(el("code", null, msg.content));
    t.appendChild(pre);
    div.appendChild(t);
  } else {
    if (msg.reasoning) {
      const d = el("details", "reasoning");
      d.open = !msg.content && !msg.done;
      d.appendChild(el("summary", null, msg.done || msg.content ? "Reasoning" : "Reasoning…"));
      d.appendChild(el("div", "text", msg.reasoning));
      div.appendChild(d);
    }
    const body = el("div", "body");
    markdown(msg.content || "", body);
    div.appendChild(body);
    for (const call of msg.tool_calls || []) {
      const t = el("div", "tool");
      t.appendChild(el("div", "head", "tool call: " + (call.function && call.function.name)));
      const pre = el("pre");
      let args = call.function ? call.function.arguments : "";
      try {
        args = JSON.stringify(JSON.parse(args), null, 2);
      } catch (_) {}
      pre.appendChild(el("code", null, args));
      t.appendChild(pre);
      div.appendChild(t);
    }
    if (msg.stopped) div.appendChild(el("div", "stopped", "stopped"));
    if (msg.error) div.appendChild(el("div", "error", msg.error));
    const st = statsLine(msg);
    if (st) div.appendChild(st);
  }
  if (msg.done !== false) {
    const actions = el("div", "actions");
    const copy = el("button", null, "Copy");
    copy.addEventListener("click", () => copyText(msg.content || "", copy));
    actions.appendChild(copy);
    if (msg.role === "user") {
      const edit = el("button", "edit", "Edit");
      edit.addEventListener("click", () => editFrom(c, index));
      actions.appendChild(edit);
    }
    if (msg.role === "assistant" && index === c.messages.length - 1) {
      const again = el("button", "regenerate", "Regenerate");
      again.addEventListener("click", () => regenerate(c));
      actions.appendChild(again);
    }
    div.appendChild(actions);
  }
  return div;
}

function renderMessages() {
  const box = $("messages");
  const c = conv();
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  box.textContent = "";
  if (!c || !c.messages.length) {
    const empty = el("div");
    empty.id = "empty";
    empty.appendChild(el("h1", null, "hearth"));
    empty.appendChild(el("p", null, "Ask anything. Each conversation keeps its own KV cache on the server, so a reply to a long conversation starts at once."));
    empty.appendChild(el("p", "hint", "Enter sends, Shift+Enter adds a line, Esc stops a reply."));
    box.appendChild(empty);
  } else {
    c.messages.forEach((m, i) => box.appendChild(renderMessage(m, i, c)));
  }
  if (atBottom || (state.busy && state.busy.conv === c)) box.scrollTop = box.scrollHeight;
}

let frame = 0;
function renderSoon() {
  if (frame) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    renderMessages();
    updateContext();
  });
}

function renderAll() {
  renderList();
  renderMessages();
  updateContext();
  const busy = !!state.busy;
  $("stop").hidden = !busy;
  $("send").hidden = busy;
}

function updateContext() {
  const c = conv();
  const m = currentModel();
  const max = m && m.max_model_len;
  let used = 0;
  if (c) {
    for (let i = c.messages.length - 1; i >= 0; i--) {
      const s = c.messages[i].stats;
      if (s && s.prompt_tokens != null) {
        used = s.prompt_tokens + (s.completion_tokens || 0);
        break;
      }
    }
  }
  $("ctx").textContent = max ? "context " + used + " / " + max + " tokens" : "";
}

// ---- sending -------------------------------------------------------------------

function showError(text) {
  const e = $("error-banner") || el("div", "msg");
  e.id = "error-banner";
  e.textContent = "";
  e.appendChild(el("div", "error", text));
  $("messages").appendChild(e);
  $("messages").scrollTop = $("messages").scrollHeight;
}

function wireMessages(c) {
  const s = settings();
  const out = [];
  if (s.system) out.push({ role: "system", content: s.system });
  for (const m of c.messages) {
    if (m.role === "user") {
      if (m.images && m.images.length) {
        out.push({
          role: "user",
          content: [{ type: "text", text: m.content }].concat(
            m.images.map((u) => ({ type: "image_url", image_url: { url: u } }))
          ),
        });
      } else out.push({ role: "user", content: m.content });
    } else if (m.role === "assistant") {
      if (m.error && !m.content && !(m.tool_calls || []).length) continue;
      const a = { role: "assistant", content: m.content || "" };
      if (m.tool_calls && m.tool_calls.length) a.tool_calls = m.tool_calls;
      out.push(a);
    } else if (m.role === "tool") {
      out.push({ role: "tool", content: m.content, tool_call_id: m.tool_call_id });
    }
  }
  return out;
}

function num(v) {
  return v === "" || v == null || isNaN(Number(v)) ? undefined : Number(v);
}

async function generate(c) {
  const msg = { role: "assistant", content: "", reasoning: "", tool_calls: [], done: false };
  c.messages.push(msg);
  const controller = new AbortController();
  state.busy = { controller, conv: c, msg };
  renderAll();
  const s = settings();
  const body = {
    model: $("model").value || undefined,
    messages: wireMessages({ messages: c.messages.slice(0, -1) }),
    stream: true,
    stream_options: { include_usage: true },
    session_id: c.id,
    temperature: num(s.temperature),
    top_p: num(s.top_p),
    max_tokens: num(s.max_tokens),
  };
  try {
    const res = await api("/v1/chat/completions", body, controller.signal);
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          onChunk(msg, JSON.parse(data));
        }
      }
      renderSoon();
    }
  } catch (e) {
    if (e.name === "AbortError") msg.stopped = true;
    else msg.error = e.message;
  }
  msg.done = true;
  state.busy = null;
  save();
  renderAll();
}

function onChunk(msg, j) {
  if (j.error) {
    msg.error = j.error.message || JSON.stringify(j.error);
    return;
  }
  const choice = j.choices && j.choices[0];
  if (choice) {
    const d = choice.delta || {};
    if (d.content) msg.content += d.content;
    if (d.reasoning_content) msg.reasoning += d.reasoning_content;
    for (const t of d.tool_calls || []) {
      const i = t.index || 0;
      const call = msg.tool_calls[i] || (msg.tool_calls[i] = { id: t.id, type: "function", function: { name: "", arguments: "" } });
      if (t.id) call.id = t.id;
      if (t.function && t.function.name) call.function.name += t.function.name;
      if (t.function && t.function.arguments) call.function.arguments += t.function.arguments;
    }
    if (choice.finish_reason) msg.stats = Object.assign(msg.stats || {}, { finish: choice.finish_reason });
  }
  if (j.usage) {
    msg.stats = Object.assign(msg.stats || {}, {
      prompt_tokens: j.usage.prompt_tokens,
      completion_tokens: j.usage.completion_tokens,
      cached_tokens: j.usage.prompt_tokens_details && j.usage.prompt_tokens_details.cached_tokens,
      timings: j.timings,
    });
  }
}

function send() {
  if (state.busy) return;
  const text = $("input").value;
  if (!text.trim() && !state.attachments.length) return;
  if (!conv()) newConversation();
  const c = conv();
  const m = { role: "user", content: text };
  if (state.attachments.length) m.images = state.attachments.slice();
  c.messages.push(m);
  if (c.title === "New chat") c.title = text.trim().split("\n")[0].slice(0, 48) || "Image";
  $("input").value = "";
  state.attachments = [];
  renderAttachments();
  autosize();
  $("draft-tokens").textContent = "";
  save();
  renderList();
  generate(c);
}

function stop() {
  if (state.busy) state.busy.controller.abort();
}

function regenerate(c) {
  if (state.busy) return;
  const last = c.messages[c.messages.length - 1];
  if (last && last.role === "assistant") c.messages.pop();
  generate(c);
}

function editFrom(c, index) {
  if (state.busy) return;
  const m = c.messages[index];
  $("input").value = m.content;
  state.attachments = (m.images || []).slice();
  c.messages.splice(index);
  save();
  renderAttachments();
  renderAll();
  autosize();
  $("input").focus();
}

// ---- images -----------------------------------------------------------------------

function addImages(files) {
  const m = currentModel();
  if (!(m && m.capabilities && m.capabilities.vision)) {
    showError("This model takes no images (start hearth serve with --mmproj for one that does).");
    return;
  }
  for (const f of files) {
    if (!f.type.startsWith("image/")) continue;
    const r = new FileReader();
    r.onload = () => {
      state.attachments.push(r.result);
      renderAttachments();
    };
    r.readAsDataURL(f);
  }
}

function renderAttachments() {
  const box = $("attachments");
  box.textContent = "";
  state.attachments.forEach((src, i) => {
    const d = el("div", "att");
    const img = el("img");
    img.src = src;
    img.alt = "image to send";
    d.appendChild(img);
    const x = el("button", null, "×");
    x.setAttribute("aria-label", "Remove image");
    x.addEventListener("click", () => {
      state.attachments.splice(i, 1);
      renderAttachments();
    });
    d.appendChild(x);
    box.appendChild(d);
  });
}

// ---- draft token count ---------------------------------------------------------

function countDraft() {
  clearTimeout(state.draftTimer);
  const text = $("input").value;
  if (!text) {
    $("draft-tokens").textContent = "";
    return;
  }
  state.draftTimer = setTimeout(async () => {
    try {
      const res = await api("/tokenize", { model: $("model").value || undefined, content: text });
      const j = await res.json();
      if ($("input").value === text) $("draft-tokens").textContent = j.tokens.length + " tokens";
    } catch (_) {
      $("draft-tokens").textContent = "";
    }
  }, 300);
}

function autosize() {
  const t = $("input");
  t.style.height = "auto";
  t.style.height = Math.min(t.scrollHeight + 2, window.innerHeight * 0.4) + "px";
}

// ---- settings, key, theme, export ------------------------------------------------

function openSettings() {
  const s = settings();
  $("set-system").value = s.system || "";
  $("set-temperature").value = s.temperature == null ? "" : s.temperature;
  $("set-top-p").value = s.top_p == null ? "" : s.top_p;
  $("set-max-tokens").value = s.max_tokens == null ? "" : s.max_tokens;
  $("set-key").value = localStorage.getItem(KEY) || "";
  $("settings").showModal();
}

function saveSettings() {
  const s = {
    system: $("set-system").value,
    temperature: num($("set-temperature").value),
    top_p: num($("set-top-p").value),
    max_tokens: num($("set-max-tokens").value),
  };
  localStorage.setItem(SETTINGS, JSON.stringify(s));
  const key = $("set-key").value.trim();
  if (key) localStorage.setItem(KEY, key);
  else localStorage.removeItem(KEY);
  $("settings").close();
  loadModels();
}

function askKey(why) {
  const d = $("key-dialog");
  $("key-error").hidden = !why;
  $("key-error").textContent = why || "";
  if (!d.open) d.showModal();
  $("key-input").focus();
}

async function useKey() {
  const key = $("key-input").value.trim();
  if (!key) return;
  localStorage.setItem(KEY, key);
  const res = await fetch("/v1/models", { headers: headers() });
  if (res.status === 401) {
    $("key-error").hidden = false;
    $("key-error").textContent = "The server refused this key.";
    return;
  }
  $("key-dialog").close();
  loadModels();
}

function applyTheme() {
  const t = localStorage.getItem(THEME) || "auto";
  if (t === "auto") delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = t;
  $("theme").textContent = "Theme: " + t;
}

function cycleTheme() {
  const order = ["auto", "light", "dark"];
  const t = localStorage.getItem(THEME) || "auto";
  localStorage.setItem(THEME, order[(order.indexOf(t) + 1) % order.length]);
  applyTheme();
}

function exportAll() {
  const blob = new Blob([JSON.stringify({ hearth: 1, conversations: state.conversations }, null, 1)], {
    type: "application/json",
  });
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  a.download = "hearth-conversations.json";
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function importFile(file) {
  const r = new FileReader();
  r.onload = () => {
    try {
      const j = JSON.parse(r.result);
      const list = Array.isArray(j) ? j : j.conversations;
      if (!Array.isArray(list)) throw new Error("expected a list of conversations");
      let n = 0;
      // Unshifted last first: the file's order is kept, ahead of what was here.
      for (const c of list.slice().reverse()) {
        if (!c || typeof c.id !== "string" || !Array.isArray(c.messages)) continue;
        const msgs = c.messages
          .filter((m) => m && ["user", "assistant", "tool"].includes(m.role))
          .map((m) => Object.assign({}, m, { content: String(m.content == null ? "" : m.content), done: true }));
        const clean = { id: c.id, title: String(c.title || "Imported"), created: Number(c.created) || Date.now(), messages: msgs };
        state.conversations = state.conversations.filter((x) => x.id !== c.id);
        state.conversations.unshift(clean);
        n++;
      }
      if (!n) throw new Error("no conversations in it");
      state.current = state.conversations[0].id;
      save();
      renderAll();
    } catch (e) {
      showError("Could not import " + file.name + ": " + e.message);
    }
  };
  r.readAsText(file);
}

// ---- start ------------------------------------------------------------------------

function start() {
  state.conversations = load(STORE, []).filter((c) => c && c.id && Array.isArray(c.messages));
  for (const c of state.conversations) {
    for (const m of c.messages) if (m.done === false) (m.done = true), (m.stopped = true);
  }
  const cur = localStorage.getItem("hearth.current");
  state.current = state.conversations.some((c) => c.id === cur)
    ? cur
    : state.conversations.length
      ? state.conversations[0].id
      : null;
  applyTheme();
  $("new-chat").addEventListener("click", newConversation);
  $("send").addEventListener("click", send);
  $("stop").addEventListener("click", stop);
  $("model").addEventListener("change", modelChanged);
  $("settings-open").addEventListener("click", openSettings);
  $("settings-save").addEventListener("click", saveSettings);
  $("settings-cancel").addEventListener("click", () => $("settings").close());
  $("key-save").addEventListener("click", useKey);
  $("key-input").addEventListener("keydown", (e) => e.key === "Enter" && useKey());
  $("theme").addEventListener("click", cycleTheme);
  $("export").addEventListener("click", exportAll);
  $("import").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", (e) => e.target.files[0] && importFile(e.target.files[0]));
  $("menu").addEventListener("click", () => $("app").classList.toggle("side-open"));
  $("attach-button").addEventListener("click", () => $("attach").click());
  $("attach").addEventListener("change", (e) => {
    addImages(e.target.files);
    e.target.value = "";
  });
  const input = $("input");
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  input.addEventListener("input", () => {
    autosize();
    countDraft();
  });
  input.addEventListener("paste", (e) => {
    const files = Array.from(e.clipboardData.files || []);
    if (files.length) {
      e.preventDefault();
      addImages(files);
    }
  });
  const composer = $("composer");
  composer.addEventListener("dragover", (e) => {
    e.preventDefault();
    composer.classList.add("dragging");
  });
  composer.addEventListener("dragleave", () => composer.classList.remove("dragging"));
  composer.addEventListener("drop", (e) => {
    e.preventDefault();
    composer.classList.remove("dragging");
    addImages(e.dataTransfer.files);
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.busy) stop();
    if ((e.ctrlKey || e.metaKey) && e.shiftKey && e.key.toLowerCase() === "o") {
      e.preventDefault();
      newConversation();
    }
  });
  renderAll();
  loadModels();
  input.focus();
}

start();
