// The server's OpenAI API as the page uses it: the model list, and chat completions streamed as SSE.

export class ApiError extends Error {}

function headers(apiKey, json) {
  const result = {};
  if (json) result["Content-Type"] = "application/json";
  if (apiKey) result["Authorization"] = `Bearer ${apiKey}`;
  return result;
}

async function errorFrom(response) {
  const text = await response.text().catch(() => "");
  let message = "";
  try {
    message = JSON.parse(text)?.error?.message || "";
  } catch {
    message = text.slice(0, 300);
  }
  const status = `${response.status}${response.statusText ? ` ${response.statusText}` : ""}`;
  const retry = response.headers.get("Retry-After");
  const hints = {
    401: " Set the server's API key in Settings.",
    429: ` The server is busy: send again${retry ? ` in ${retry} s` : " later"}.`,
  };
  const hint = hints[response.status] || "";
  return new ApiError(`The server answered ${status}: ${message || "no details"}.${hint}`);
}

async function request(url, init) {
  try {
    return await fetch(url, init);
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(`Could not reach the server (${e.message}). Is it still running?`);
  }
}

/** The ids of the models the server serves. */
export async function listModels(apiKey) {
  const response = await request("/v1/models", { headers: headers(apiKey, false) });
  if (!response.ok) throw await errorFrom(response);
  const body = await response.json();
  return (body.data || []).map((model) => model.id);
}

/** Posts a streaming chat completion; calls onChunk(parsed JSON) for every SSE event until [DONE]. */
export async function streamChat(body, apiKey, signal, onChunk) {
  const response = await request("/v1/chat/completions", {
    method: "POST", headers: headers(apiKey, true), signal,
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
  });
  if (!response.ok) throw await errorFrom(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    let read;
    try {
      read = await reader.read();
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError(`The connection broke off mid-answer (${e.message}).`);
    }
    if (read.done) throw new ApiError("The stream ended before the server finished the answer.");
    buffer += read.value;
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = events.pop();
    for (const event of events) {
      const data = event.split(/\r?\n/).filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(`The server reported an error: ${chunk.error.message || "no details"}.`);
      onChunk(chunk);
    }
  }
}
