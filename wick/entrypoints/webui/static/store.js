// What the page keeps in localStorage: the conversations, which one is open, the settings and the API key.
export const KEYS = { conversations: "wick.conversations", current: "wick.current", settings: "wick.settings",
               apiKey: "wick.apiKey" };

const DEFAULT_SETTINGS = { systemPrompt: "", temperature: "", topP: "", maxTokens: "", model: "" };

function read(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false; // Storage full or disabled: the page still works, it only forgets on reload.
  }
}

export function newId() {
  return crypto.randomUUID ? crypto.randomUUID() : `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

export function loadConversations() {
  const list = read(KEYS.conversations, []);
  return Array.isArray(list) ? list.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)) : [];
}

export function saveConversations(conversations) {
  return write(KEYS.conversations, conversations);
}

export function loadCurrentId() {
  return read(KEYS.current, null);
}

export function saveCurrentId(id) {
  write(KEYS.current, id);
}

export function loadSettings() {
  return { ...DEFAULT_SETTINGS, ...read(KEYS.settings, {}) };
}

export function saveSettings(settings) {
  write(KEYS.settings, settings);
}

export function loadApiKey() {
  return localStorage.getItem(KEYS.apiKey) || "";
}

export function saveApiKey(key) {
  if (key) localStorage.setItem(KEYS.apiKey, key);
  else localStorage.removeItem(KEYS.apiKey);
}
