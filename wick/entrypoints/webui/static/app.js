// The chat page: conversations in localStorage, answers streamed from /v1/chat/completions.
import { ApiError, listModels, streamChat } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import * as store from "./store.js";

const $ = (id) => document.getElementById(id);
const el = {
  app: $("app"), sidebar: $("sidebar"), scrim: $("scrim"), list: $("conversation-list"), newChat: $("new-chat"),
  closeSidebar: $("close-sidebar"), toggleSidebar: $("toggle-sidebar"), title: $("chat-title"),
  model: $("model-select"), openSettings: $("open-settings"), banner: $("banner"), messages: $("messages"),
  emptyHint: $("empty-hint"), composer: $("composer"), prompt: $("prompt"), send: $("send"), stop: $("stop"),
  settings: $("settings"), systemPrompt: $("system-prompt"), temperature: $("temperature"), topP: $("top-p"),
  maxTokens: $("max-tokens"), apiKey: $("api-key"),
};
const narrow = window.matchMedia("(max-width: 760px)");
const UNTITLED = "New chat";
const SAVE_EVERY_MS = 1000;

const state = {
  conversations: store.loadConversations(),
  currentId: store.loadCurrentId(),
  settings: store.loadSettings(),
  apiKey: store.loadApiKey(),
  live: null, // the answer being streamed: { convId, msg, controller }
  lastSave: 0,
  frame: 0,
};

const current = () => state.conversations.find((c) => c.id === state.currentId) || null;

function persist() {
  state.lastSave = performance.now();
  if (!store.saveConversations(state.conversations)) {
    showBanner("The browser refused to store the conversations (storage full?); they will be lost on reload.");
  }
  store.saveCurrentId(state.currentId);
}

// ---- banner -------------------------------------------------------------------------------------------

function showBanner(text) {
  const dismiss = document.createElement("button");
  dismiss.type = "button";
  dismiss.className = "icon";
  dismiss.setAttribute("aria-label", "Dismiss message");
  dismiss.textContent = "✕";
  dismiss.addEventListener("click", hideBanner);
  const message = document.createElement("span");
  message.textContent = text;
  el.banner.replaceChildren(message, dismiss);
  el.banner.hidden = false;
}

function hideBanner() {
  el.banner.hidden = true;
  el.banner.replaceChildren();
}

// ---- sidebar ------------------------------------------------------------------------------------------

function setSidebar(open) {
  el.app.classList.toggle(narrow.matches ? "sidebar-open" : "sidebar-collapsed", narrow.matches ? open : !open);
  el.scrim.hidden = !(narrow.matches && open);
  el.toggleSidebar.setAttribute("aria-expanded", String(open));
}

function sidebarOpen() {
  return narrow.matches ? el.app.classList.contains("sidebar-open") : !el.app.classList.contains("sidebar-collapsed");
}

function renderSidebar() {
  const items = [...state.conversations].sort((a, b) => b.updated - a.updated).map((conv) => {
    const item = document.createElement("li");
    item.className = "conversation";
    item.dataset.id = conv.id;
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = conv.title;
    open.title = conv.title;
    if (conv.id === state.currentId) {
      item.classList.add("active");
      open.setAttribute("aria-current", "true");
    }
    open.addEventListener("click", () => selectConversation(conv.id));
    const rename = iconButton("✎", `Rename conversation ${conv.title}`, () => startRename(item, conv));
    rename.classList.add("rename");
    const remove = iconButton("✕", `Delete conversation ${conv.title}`, () => deleteConversation(conv));
    remove.classList.add("delete");
    item.append(open, rename, remove);
    return item;
  });
  el.list.replaceChildren(...items);
}

function iconButton(text, label, onClick) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "icon";
  button.textContent = text;
  button.setAttribute("aria-label", label);
  button.title = label;
  button.addEventListener("click", onClick);
  return button;
}

function startRename(item, conv) {
  const input = document.createElement("input");
  input.type = "text";
  input.className = "rename-input";
  input.value = conv.title;
  input.setAttribute("aria-label", "New name for the conversation");
  let done = false;
  const finish = (commit) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    if (commit && title) {
      conv.title = title;
      persist();
    }
    renderSidebar();
    renderTitle();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      e.preventDefault();
      finish(true);
    } else if (e.key === "Escape") {
      finish(false);
    }
  });
  input.addEventListener("blur", () => finish(true));
  item.replaceChildren(input);
  input.focus();
  input.select();
}

function deleteConversation(conv) {
  if (!window.confirm(`Delete the conversation "${conv.title}"?`)) return;
  if (state.live?.convId === conv.id) state.live.controller.abort();
  state.conversations = state.conversations.filter((c) => c.id !== conv.id);
  if (state.currentId === conv.id) {
    const next = [...state.conversations].sort((a, b) => b.updated - a.updated)[0];
    state.currentId = next ? next.id : null;
  }
  persist();
  renderAll();
}

function selectConversation(id) {
  state.currentId = id;
  store.saveCurrentId(id);
  renderAll();
  if (narrow.matches) setSidebar(false);
  el.prompt.focus();
}

function newChat() {
  state.currentId = null;
  store.saveCurrentId(null);
  renderAll();
  if (narrow.matches) setSidebar(false);
  el.prompt.focus();
}

// ---- messages -----------------------------------------------------------------------------------------

function renderTitle() {
  const conv = current();
  el.title.textContent = conv ? conv.title : UNTITLED;
  document.title = conv ? `${conv.title} · wick chat` : "wick chat";
}

function renderAll() {
  renderSidebar();
  renderTitle();
  renderMessages();
}

function renderMessages() {
  const conv = current();
  const messages = conv ? conv.messages : [];
  const lastAssistant = messages.findLastIndex((m) => m.role === "assistant");
  const nodes = messages.map((msg, i) => messageElement(msg, conv, i === lastAssistant));
  el.emptyHint.hidden = messages.length > 0;
  el.messages.replaceChildren(el.emptyHint, ...nodes);
  el.messages.scrollTop = el.messages.scrollHeight;
}

const ROLE_LABELS = { user: "You", assistant: "Assistant", tool: "Tool result", system: "System" };

function messageElement(msg, conv, isLastAnswer) {
  const article = document.createElement("article");
  article.className = `message ${msg.role}`;
  article.id = `msg-${msg.id}`;
  article.setAttribute("aria-label", ROLE_LABELS[msg.role] || msg.role);
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = ROLE_LABELS[msg.role] || msg.role;
  const reasoning = document.createElement("details");
  reasoning.className = "reasoning";
  reasoning.append(document.createElement("summary"), document.createElement("div"));
  const content = document.createElement("div");
  content.className = "content";
  const tools = document.createElement("div");
  tools.className = "tool-calls";
  const error = document.createElement("div");
  error.className = "error";
  error.setAttribute("role", "alert");
  const footer = document.createElement("footer");
  const stats = document.createElement("span");
  stats.className = "stats";
  footer.append(stats, messageActions(msg, conv, isLastAnswer));
  article.append(role, reasoning, content, tools, error, footer);
  fillMessage(article, msg);
  return article;
}

function messageActions(msg, conv, isLastAnswer) {
  const actions = document.createElement("span");
  actions.className = "actions";
  if (msg.role === "assistant" && state.live?.msg === msg) return actions;
  const label = ROLE_LABELS[msg.role] || msg.role;
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "copy";
  copy.textContent = "Copy";
  copy.setAttribute("aria-label", `Copy this ${label.toLowerCase()} message`);
  copy.addEventListener("click", () => copyText(msg.content || "", copy));
  actions.append(copy);
  if (isLastAnswer) {
    const regenerate = document.createElement("button");
    regenerate.type = "button";
    regenerate.className = "regenerate";
    regenerate.textContent = "Regenerate";
    regenerate.setAttribute("aria-label", "Regenerate this answer");
    regenerate.disabled = Boolean(state.live);
    regenerate.addEventListener("click", () => regenerateAnswer(conv, msg));
    actions.append(regenerate);
  }
  return actions;
}

function fillMessage(article, msg) {
  const [reasoning, content, tools, error] = ["reasoning", "content", "tool-calls", "error"]
    .map((name) => article.querySelector(`:scope > .${name}`));
  const live = state.live?.msg === msg;

  reasoning.hidden = !msg.reasoning;
  if (msg.reasoning) {
    reasoning.firstChild.textContent = live && !msg.content ? "Thinking…" : "Reasoning";
    renderMarkdown(reasoning.lastChild, msg.reasoning);
  }

  if (msg.role === "user") content.textContent = msg.content;
  else if (msg.role === "tool") renderToolResult(content, msg);
  else renderMarkdown(content, msg.content || "");
  content.classList.toggle("streaming", live);

  const calls = (msg.toolCalls || []).filter(Boolean);
  tools.hidden = calls.length === 0;
  tools.replaceChildren(...calls.map(toolCallElement));

  error.hidden = !msg.error;
  error.textContent = msg.error || "";

  article.querySelector(":scope > footer > .stats").textContent = statsText(msg, live);
}

function toolCallElement(call) {
  const details = document.createElement("details");
  details.className = "tool-call";
  details.open = true;
  const summary = document.createElement("summary");
  summary.textContent = `Tool call: ${call.name || "(unnamed)"}`;
  const args = document.createElement("pre");
  args.textContent = prettyJson(call.arguments);
  details.append(summary, args);
  return details;
}

function renderToolResult(container, msg) {
  const details = document.createElement("details");
  details.className = "tool-result";
  const summary = document.createElement("summary");
  summary.textContent = msg.tool_call_id ? `Result of ${msg.tool_call_id}` : "Result";
  const body = document.createElement("pre");
  body.textContent = prettyJson(msg.content || "");
  details.append(summary, body);
  container.replaceChildren(details);
}

function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

function statsText(msg, live) {
  if (msg.role !== "assistant") return "";
  if (live) return "generating…";
  const parts = [];
  if (msg.stopped) parts.push("stopped");
  const s = msg.stats || {};
  if (s.ttftMs != null) parts.push(`first token ${(s.ttftMs / 1000).toFixed(2)} s`);
  if (s.tokens != null) parts.push(`${s.tokens} tokens`);
  if (s.tokensPerS != null) parts.push(`${s.tokensPerS.toFixed(1)} tokens/s`);
  if (msg.finishReason === "length") parts.push("cut at max tokens");
  return parts.join(" · ");
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // No clipboard API (a page served over plain HTTP to another host): the older way.
    const area = document.createElement("textarea");
    area.value = text;
    area.className = "offscreen";
    area.setAttribute("aria-hidden", "true");
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}

// ---- generating ---------------------------------------------------------------------------------------

function setBusy(busy) {
  el.send.hidden = busy;
  el.stop.hidden = !busy;
  el.composer.classList.toggle("busy", busy);
  el.messages.setAttribute("aria-busy", String(busy));
  for (const button of el.messages.querySelectorAll("button.regenerate")) button.disabled = busy;
}

function apiMessages(conv) {
  const result = [];
  if (state.settings.systemPrompt.trim()) result.push({ role: "system", content: state.settings.systemPrompt });
  for (const msg of conv.messages) {
    if (msg.role === "assistant" && msg.error && !msg.content) continue;
    const entry = { role: msg.role, content: msg.content || "" };
    const calls = (msg.toolCalls || []).filter(Boolean);
    if (calls.length) {
      entry.tool_calls = calls.map((c) => ({ id: c.id, type: "function",
                                            function: { name: c.name, arguments: c.arguments } }));
    }
    if (msg.tool_call_id) entry.tool_call_id = msg.tool_call_id;
    result.push(entry);
  }
  return result;
}

function requestBody(conv) {
  const body = { messages: apiMessages(conv) };
  if (state.settings.model) body.model = state.settings.model;
  const number = (value) => (String(value).trim() === "" ? NaN : Number(value));
  const temperature = number(state.settings.temperature);
  const topP = number(state.settings.topP);
  const maxTokens = number(state.settings.maxTokens);
  if (Number.isFinite(temperature)) body.temperature = temperature;
  if (Number.isFinite(topP)) body.top_p = topP;
  if (Number.isFinite(maxTokens)) body.max_tokens = Math.round(maxTokens);
  return body;
}

function mergeToolCall(calls, delta) {
  const index = delta.index ?? calls.length;
  calls[index] ??= { id: "", name: "", arguments: "" };
  const call = calls[index];
  if (delta.id) call.id = delta.id;
  if (delta.function?.name) call.name += delta.function.name;
  if (delta.function?.arguments) call.arguments += delta.function.arguments;
}

function scheduleLiveUpdate() {
  if (state.frame) return;
  state.frame = requestAnimationFrame(() => {
    state.frame = 0;
    const live = state.live;
    if (!live) return;
    const article = document.getElementById(`msg-${live.msg.id}`);
    if (article) {
      const box = el.messages;
      const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
      fillMessage(article, live.msg);
      if (atBottom) box.scrollTop = box.scrollHeight;
    }
    if (performance.now() - state.lastSave > SAVE_EVERY_MS) persist();
  });
}

async function generate(conv) {
  const body = requestBody(conv);
  const msg = { id: store.newId(), role: "assistant", content: "", reasoning: "", toolCalls: [] };
  conv.messages.push(msg);
  conv.updated = Date.now();
  const controller = new AbortController();
  state.live = { convId: conv.id, msg, controller };
  persist();
  renderAll();
  setBusy(true);

  const started = performance.now();
  let first = null;
  let usage = null;
  try {
    await streamChat(body, state.apiKey, controller.signal, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) return;
      const delta = choice.delta || {};
      const reasoning = delta.reasoning_content ?? delta.reasoning;
      if (reasoning) msg.reasoning += reasoning;
      if (delta.content) msg.content += delta.content;
      for (const call of delta.tool_calls || []) mergeToolCall(msg.toolCalls, call);
      if (first === null && (reasoning || delta.content || delta.tool_calls?.length)) first = performance.now();
      if (choice.finish_reason) msg.finishReason = choice.finish_reason;
      scheduleLiveUpdate();
    });
  } catch (e) {
    if (e.name === "AbortError") msg.stopped = true;
    else msg.error = e instanceof ApiError ? e.message : `Something went wrong: ${e.message}`;
  }
  const ended = performance.now();
  const tokens = usage?.completion_tokens ?? null;
  msg.stats = {
    ttftMs: first === null ? null : first - started,
    tokens,
    tokensPerS: tokens > 1 && first !== null && ended > first ? (tokens - 1) / ((ended - first) / 1000) : null,
  };
  state.live = null;
  conv.updated = Date.now();
  persist();
  setBusy(false);
  renderAll();
}

function sendPrompt() {
  const text = el.prompt.value.trim();
  if (!text || state.live) return;
  let conv = current();
  if (!conv) {
    conv = { id: store.newId(), title: UNTITLED, created: Date.now(), updated: Date.now(), messages: [] };
    state.conversations.push(conv);
    state.currentId = conv.id;
  }
  if (conv.title === UNTITLED) conv.title = text.split("\n")[0].slice(0, 60);
  conv.messages.push({ id: store.newId(), role: "user", content: text });
  el.prompt.value = "";
  autosize();
  generate(conv);
}

function regenerateAnswer(conv, msg) {
  if (state.live) return;
  conv.messages = conv.messages.filter((m) => m !== msg);
  generate(conv);
}

// ---- models and settings ------------------------------------------------------------------------------

async function refreshModels() {
  let models = [];
  try {
    models = await listModels(state.apiKey);
    hideBanner();
  } catch (e) {
    showBanner(e instanceof ApiError ? e.message : `Could not list the models: ${e.message}`);
  }
  const chosen = models.includes(state.settings.model) ? state.settings.model : models[0] || "";
  const options = models.map((id) => new Option(id, id, false, id === chosen));
  if (!options.length) options.push(new Option("(no model list)", "", true, true));
  el.model.replaceChildren(...options);
  el.model.disabled = !models.length;
  state.settings.model = chosen;
}

function openSettings() {
  el.systemPrompt.value = state.settings.systemPrompt;
  el.temperature.value = state.settings.temperature;
  el.topP.value = state.settings.topP;
  el.maxTokens.value = state.settings.maxTokens;
  el.apiKey.value = state.apiKey;
  el.settings.showModal();
}

function saveSettingsFromForm() {
  Object.assign(state.settings, {
    systemPrompt: el.systemPrompt.value, temperature: el.temperature.value, topP: el.topP.value,
    maxTokens: el.maxTokens.value,
  });
  store.saveSettings(state.settings);
}

function settingsClosed() {
  saveSettingsFromForm();
  const key = el.apiKey.value.trim();
  if (key !== state.apiKey) {
    state.apiKey = key;
    store.saveApiKey(key);
    refreshModels();
  }
}

// ---- composer -----------------------------------------------------------------------------------------

function autosize() {
  el.prompt.style.height = "auto";
  el.prompt.style.height = `${el.prompt.scrollHeight}px`;
}

el.composer.addEventListener("submit", (e) => {
  e.preventDefault();
  sendPrompt();
});
el.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    sendPrompt();
  }
});
el.prompt.addEventListener("input", autosize);
el.stop.addEventListener("click", () => state.live?.controller.abort());
el.newChat.addEventListener("click", newChat);
el.toggleSidebar.addEventListener("click", () => setSidebar(!sidebarOpen()));
el.closeSidebar.addEventListener("click", () => setSidebar(false));
el.scrim.addEventListener("click", () => setSidebar(false));
narrow.addEventListener("change", () => setSidebar(!narrow.matches));
el.model.addEventListener("change", () => {
  state.settings.model = el.model.value;
  store.saveSettings(state.settings);
});
el.openSettings.addEventListener("click", openSettings);
el.settings.addEventListener("input", saveSettingsFromForm);
el.settings.addEventListener("close", settingsClosed);
window.addEventListener("storage", (e) => {
  // Another tab changed the conversations: take them, unless this tab is streaming into them.
  if (e.key === store.KEYS.conversations && !state.live) {
    state.conversations = store.loadConversations();
    renderAll();
  }
});

if (state.currentId && !current()) state.currentId = null;
setSidebar(!narrow.matches);
renderAll();
refreshModels();
el.prompt.focus();
