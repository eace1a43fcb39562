// Markdown to safe DOM: marked renders, highlight.js colours code, and an allow-list sanitizer keeps
// only inert elements and attributes, so model text never becomes live HTML or script.
import { Marked } from "./vendor/marked/marked.esm.js";
import hljs from "./vendor/highlight/core.min.js";
import bash from "./vendor/highlight/languages/bash.min.js";
import c from "./vendor/highlight/languages/c.min.js";
import cpp from "./vendor/highlight/languages/cpp.min.js";
import css from "./vendor/highlight/languages/css.min.js";
import diff from "./vendor/highlight/languages/diff.min.js";
import go from "./vendor/highlight/languages/go.min.js";
import java from "./vendor/highlight/languages/java.min.js";
import javascript from "./vendor/highlight/languages/javascript.min.js";
import json from "./vendor/highlight/languages/json.min.js";
import markdown from "./vendor/highlight/languages/markdown.min.js";
import python from "./vendor/highlight/languages/python.min.js";
import rust from "./vendor/highlight/languages/rust.min.js";
import sql from "./vendor/highlight/languages/sql.min.js";
import typescript from "./vendor/highlight/languages/typescript.min.js";
import xml from "./vendor/highlight/languages/xml.min.js";
import yaml from "./vendor/highlight/languages/yaml.min.js";

const LANGUAGES = { bash, c, cpp, css, diff, go, java, javascript, json, markdown, python, rust, sql, typescript,
                    xml, yaml };
for (const [name, grammar] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, grammar);

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[ch]);
}

const marked = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    // Raw HTML in model output is shown as text.
    html({ text }) {
      return escapeHtml(text);
    },
    code({ text, lang }) {
      const language = (lang || "").trim().split(/\s+/)[0].toLowerCase();
      const known = language && hljs.getLanguage(language);
      const body = known ? hljs.highlight(text, { language, ignoreIllegals: true }).value : escapeHtml(text);
      const label = known ? ` language-${escapeHtml(language)}` : "";
      return `<pre><code class="hljs${label}">${body}</code></pre>\n`;
    },
  },
});

const ALLOWED = {
  A: ["href", "title"], B: [], BLOCKQUOTE: [], BR: [], CODE: ["class"], DEL: [], EM: [], H1: [], H2: [], H3: [],
  H4: [], H5: [], H6: [], HR: [], I: [], INPUT: ["type", "checked", "disabled"], LI: [], OL: ["start"], P: [],
  PRE: [], S: [], SPAN: ["class"], STRONG: [], TABLE: [], TBODY: [], TD: ["align"], TH: ["align"], THEAD: [],
  TR: [], UL: [],
};
const SAFE_URL = /^(https?:|mailto:|#)/i;

function sanitize(root) {
  for (const el of [...root.querySelectorAll("*")]) {
    const allowed = ALLOWED[el.tagName];
    if (!allowed) {
      // Not in the list (an image, say): keep its text, drop the element.
      el.replaceWith(document.createTextNode(el.textContent || el.getAttribute("alt") || ""));
      continue;
    }
    for (const attr of [...el.attributes]) {
      if (!allowed.includes(attr.name)) el.removeAttribute(attr.name);
    }
    if (el.tagName === "INPUT" && el.getAttribute("type") !== "checkbox") el.remove();
    if (el.tagName === "A") {
      const href = el.getAttribute("href") || "";
      if (SAFE_URL.test(href.trim())) {
        el.setAttribute("target", "_blank");
        el.setAttribute("rel", "noopener noreferrer nofollow");
      } else {
        el.removeAttribute("href");
      }
    }
  }
}

/** Renders `text` as Markdown into `container`, replacing what it held. */
export function renderMarkdown(container, text) {
  const template = document.createElement("template");
  template.innerHTML = marked.parse(text);
  sanitize(template.content);
  container.replaceChildren(template.content);
}
