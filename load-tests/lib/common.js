// Shared pieces of Tessera's k6 load tests: configuration from the environment, request bodies drawn from the
// real Azure LLM 2023 token distribution, streaming completions, and the server-side summary read from vLLM's
// own /metrics (k6 buffers a streamed response, so it cannot see the first token; vLLM's
// vllm:time_to_first_token_seconds histogram can, and the difference of two scrapes gives the test's share).
//
// Environment (all optional):
//   BASE_URL           OpenAI-compatible server (vLLM, tessera vllm-sim, or the Tessera activator). Default http://127.0.0.1:8000
//   MODEL              model name to request; default: the first id from GET /v1/models
//   API                chat | completions (default chat)
//   MAX_MODEL_LEN      prompt + output are clipped to fit (default: the model's max_model_len from GET /v1/models,
//                      which vLLM and the emulator report; 4096 when the server does not say)
//   EXACT_TOKENS       1 (default) adds "tessera_prompt_tokens" so the emulator counts the prompt exactly; a real
//                      vLLM ignores the field. 0 leaves it out.
//   METRICS_URLS       comma-separated /metrics URLs to read the server-side summary from (default BASE_URL/metrics;
//                      behind the activator, list the model servers' /metrics, or "none")
//   REQUEST_TIMEOUT    per-request timeout (default 120s)
//   TTFT_P95_MAX       threshold on the server-side TTFT p95 in seconds (default 10)
//   SUMMARY_JSON       also write the summary as JSON to this path
import http from 'k6/http';
import { check } from 'k6';
import { SharedArray } from 'k6/data';
import { Counter, Gauge, Rate, Trend } from 'k6/metrics';

export const BASE_URL = (__ENV.BASE_URL || 'http://127.0.0.1:8000').replace(/\/+$/, '');
export const API = __ENV.API || 'chat';
// Set only when MAX_MODEL_LEN is given; otherwise setup() reads each model's max_model_len from the server.
export const MAX_MODEL_LEN = __ENV.MAX_MODEL_LEN ? parseInt(__ENV.MAX_MODEL_LEN, 10) : null;
const DEFAULT_MAX_MODEL_LEN = 4096;
export const EXACT_TOKENS = (__ENV.EXACT_TOKENS || '1') !== '0';
export const REQUEST_TIMEOUT = __ENV.REQUEST_TIMEOUT || '120s';
export const TTFT_P95_MAX = parseFloat(__ENV.TTFT_P95_MAX || '10');
const METRICS_URLS = (__ENV.METRICS_URLS || `${BASE_URL}/metrics`)
  .split(',').map((s) => s.trim()).filter((s) => s && s !== 'none');

// (prompt tokens, output tokens) pairs: a systematic sample of the Azure LLM inference trace 2023 (conversation),
// CC-BY 4.0, Microsoft Azure (Splitwise, ISCA 2024). See lib/make_azure_tokens.py and README.md.
const PAIRS = new SharedArray('azure_conv_tokens', () => JSON.parse(open('./azure_conv_tokens.json')).pairs);

// Words that are one token each in the common tokenizers, so a prompt of N words is about N tokens on a real vLLM.
const WORDS = ['the', 'of', 'and', 'to', 'in', 'is', 'that', 'for', 'it', 'as', 'with', 'on', 'was', 'be', 'by',
  'this', 'are', 'or', 'from', 'at', 'an', 'which', 'have', 'not', 'can', 'all', 'one', 'more', 'when', 'time'];

export const completionOk = new Rate('completion_ok');
export const outputTokens = new Counter('output_tokens');
export const promptTokens = new Counter('prompt_tokens');
export const e2eLatency = new Trend('completion_e2e_seconds');
const serverTtft = {
  p50: new Gauge('server_ttft_p50_seconds'),
  p95: new Gauge('server_ttft_p95_seconds'),
  p99: new Gauge('server_ttft_p99_seconds'),
};
const serverItlP95 = new Gauge('server_itl_p95_seconds');
const serverPreemptions = new Gauge('server_preemptions');
// 1 when the server-side summary could be read from /metrics before and after the test, else 0.
const serverMetricsFound = new Gauge('server_metrics_found');

/** Thresholds every scenario shares: few errors, and the server's own TTFT p95 under TTFT_P95_MAX. */
export function baseThresholds(extra) {
  return Object.assign({
    http_req_failed: ['rate<0.01'],
    completion_ok: ['rate>0.99'],
    server_ttft_p95_seconds: [`value<${TTFT_P95_MAX}`],
  }, extra || {});
}

/** The server's model cards (GET /v1/models `data`), or null when it does not answer with them. */
export function modelCards() {
  const r = http.get(`${BASE_URL}/v1/models`, { timeout: REQUEST_TIMEOUT });
  if (r.status !== 200) return null;
  try {
    const data = r.json('data');
    return Array.isArray(data) ? data : null;
  } catch (_) {
    return null;
  }
}

/** The model to ask for: MODEL, or the first one the server lists. */
export function resolveModel(cards) {
  if (__ENV.MODEL) return __ENV.MODEL;
  const list = cards === undefined ? modelCards() : cards;
  if (!list || list.length === 0) throw new Error(`GET ${BASE_URL}/v1/models listed no model; set MODEL explicitly`);
  return list[0].id;
}

/**
 * The context length to fit requests into for `model`: MAX_MODEL_LEN when set, else the max_model_len the server
 * reports for it (a server started with a short --max-model-len answers longer requests with 400), else 4096.
 */
export function resolveMaxModelLen(model, cards) {
  if (MAX_MODEL_LEN) return MAX_MODEL_LEN;
  const card = (cards || []).find((c) => c.id === model) || (cards || [])[0];
  const n = card ? parseInt(card.max_model_len, 10) : NaN;
  if (n > 0) return n;
  console.warn(`no max_model_len for ${model} in GET ${BASE_URL}/v1/models: assuming ${DEFAULT_MAX_MODEL_LEN}`);
  return DEFAULT_MAX_MODEL_LEN;
}

/** A (prompt, output) pair from the trace, clipped to `maxModelLen` tokens in all. */
export function samplePair(maxModelLen) {
  const len = maxModelLen || MAX_MODEL_LEN || DEFAULT_MAX_MODEL_LEN;
  const [p, o] = PAIRS[Math.floor(Math.random() * PAIRS.length)];
  const out = Math.max(1, Math.min(o, Math.floor(len / 4)));
  // 64 tokens stay free for the chat template's own tokens.
  const prompt = Math.max(1, Math.min(p, len - out - 64));
  return [prompt, out];
}

function promptText(n) {
  const words = new Array(n);
  for (let i = 0; i < n; i++) words[i] = WORDS[(i * 7 + n) % WORDS.length];
  return words.join(' ');
}

/**
 * Sends one streaming completion for `model` with a trace-drawn size that fits `maxModelLen` (from setup();
 * see resolveMaxModelLen); checks the stream and counts tokens.
 */
export function complete(model, tags, maxModelLen) {
  const [p, o] = samplePair(maxModelLen);
  const body = { model, max_tokens: o, ignore_eos: true, stream: true, stream_options: { include_usage: true } };
  // The chat template adds a few tokens of its own; leave room for them.
  const text = promptText(Math.max(1, p - 8));
  let url;
  if (API === 'completions') {
    url = `${BASE_URL}/v1/completions`;
    body.prompt = text;
  } else {
    url = `${BASE_URL}/v1/chat/completions`;
    body.messages = [{ role: 'user', content: text }];
  }
  if (EXACT_TOKENS) body.tessera_prompt_tokens = p;
  const r = http.post(url, JSON.stringify(body), {
    headers: { 'Content-Type': 'application/json' },
    timeout: REQUEST_TIMEOUT,
    tags: Object.assign({ name: url.replace(BASE_URL, '') }, tags || {}),
  });
  let usage = null;
  const ok = check(r, {
    'status is 200': (x) => x.status === 200,
    'stream ends with [DONE]': (x) => typeof x.body === 'string' && x.body.trimEnd().endsWith('data: [DONE]'),
    'usage has every token': (x) => {
      usage = parseUsage(x.body);
      return usage !== null && usage.completion_tokens === o;
    },
  }, tags);
  completionOk.add(ok, tags);
  if (ok) {
    outputTokens.add(usage.completion_tokens, tags);
    promptTokens.add(usage.prompt_tokens, tags);
    e2eLatency.add(r.timings.duration / 1000, tags);
  }
  return ok;
}

function parseUsage(body) {
  if (typeof body !== 'string') return null;
  const events = body.split('\n\n');
  for (let i = events.length - 1; i >= 0; i--) {
    const e = events[i].trim();
    if (!e.startsWith('data: {')) continue;
    try {
      const j = JSON.parse(e.slice(6));
      if (j.usage) return j.usage;
    } catch (_) { return null; }
  }
  return null;
}

// ---- server-side summary from /metrics -------------------------------------------------------------------

/** Parses one Prometheus text page into {name: [{labels, value}]} for the vllm: families we read. */
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line.startsWith('vllm:')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
      let l;
      while ((l = re.exec(m[3])) !== null) labels[l[1]] = l[2];
    }
    (out[m[1]] = out[m[1]] || []).push({ labels, value: parseFloat(m[4]) });
  }
  return out;
}

/** Cumulative buckets of histogram `name` summed over every series (engines, models): [[le, count], ...]. */
function buckets(page, name) {
  const by = new Map();
  for (const s of page[`${name}_bucket`] || []) {
    // +Inf is kept as Number.MAX_VALUE: setup() data travels as JSON, which has no Infinity.
    const le = s.labels.le === '+Inf' ? Number.MAX_VALUE : parseFloat(s.labels.le);
    by.set(le, (by.get(le) || 0) + s.value);
  }
  return [...by.entries()].sort((a, b) => a[0] - b[0]);
}

function sum(page, name) {
  return (page[name] || []).reduce((a, s) => a + s.value, 0);
}

/** Scrapes every METRICS_URLS page; null if none answers with vLLM metrics. */
export function scrape() {
  const pages = [];
  for (const u of METRICS_URLS) {
    const r = http.get(u, { timeout: '10s', tags: { name: 'metrics-scrape' } });
    if (r.status === 200 && typeof r.body === 'string' && r.body.includes('vllm:')) pages.push(parseMetrics(r.body));
  }
  if (pages.length === 0) return null;
  const ttft = [];
  const itl = [];
  let preemptions = 0;
  let generation = 0;
  for (const p of pages) {
    ttft.push(...buckets(p, 'vllm:time_to_first_token_seconds'));
    // V1 name first, then the V0 one.
    const i = buckets(p, 'vllm:inter_token_latency_seconds');
    itl.push(...(i.length ? i : buckets(p, 'vllm:time_per_output_token_seconds')));
    preemptions += sum(p, 'vllm:num_preemptions_total');
    generation += sum(p, 'vllm:generation_tokens_total');
  }
  return { ttft: merge(ttft), itl: merge(itl), preemptions, generation };
}

function merge(pairs) {
  const by = new Map();
  for (const [le, c] of pairs) by.set(le, (by.get(le) || 0) + c);
  return [...by.entries()].sort((a, b) => a[0] - b[0]);
}

/** Buckets observed between two cumulative scrapes (a restarted server: the later scrape whole). */
function diff(after, before) {
  const b = new Map(before);
  const d = after.map(([le, c]) => [le, c - (b.get(le) || 0)]);
  return d.some(([, c]) => c < 0) ? after : d;
}

/** The q-quantile by linear interpolation inside the bucket, as Prometheus' histogram_quantile does. */
export function quantile(cum, q) {
  if (cum.length === 0) return null;
  const total = cum[cum.length - 1][1];
  if (total <= 0) return null;
  const rank = q * total;
  let prevLe = 0;
  let prevC = 0;
  for (const [le, c] of cum) {
    if (c >= rank) {
      if (le >= Number.MAX_VALUE) return prevLe;
      if (c === prevC) return le;
      return prevLe + (le - prevLe) * (rank - prevC) / (c - prevC);
    }
    prevLe = le;
    prevC = c;
  }
  return prevLe;
}

/** setup(): the model to use, its context length, and the "before" scrape. */
export function setupCommon() {
  const cards = modelCards();
  const model = resolveModel(cards);
  return { model, maxModelLen: resolveMaxModelLen(model, cards), before: scrape() };
}

/** The default function of the single-model tests: one streaming completion of the model setup() resolved. */
export function completeOne(data) {
  complete(data.model, undefined, data.maxModelLen);
}

/** teardown(): the "after" scrape; records the server-side quantiles as gauges (so thresholds apply). */
export function teardownCommon(data) {
  const after = scrape();
  if (!after || !data || !data.before) {
    console.warn(`no vLLM metrics at ${METRICS_URLS.join(', ') || '(none)'}: server-side TTFT not reported`);
    serverMetricsFound.add(0);
    return;
  }
  serverMetricsFound.add(1);
  const ttft = diff(after.ttft, data.before.ttft);
  const itl = diff(after.itl, data.before.itl);
  const q = (h, x) => quantile(h, x);
  if (q(ttft, 0.5) !== null) {
    serverTtft.p50.add(q(ttft, 0.5));
    serverTtft.p95.add(q(ttft, 0.95));
    serverTtft.p99.add(q(ttft, 0.99));
  }
  if (q(itl, 0.95) !== null) serverItlP95.add(q(itl, 0.95));
  serverPreemptions.add(Math.max(0, after.preemptions - data.before.preemptions));
}

function fmt(v, unit) {
  if (v === undefined || v === null || Number.isNaN(v)) return 'n/a';
  return unit === 's' ? `${(v * 1000).toFixed(1)} ms` : `${Math.round(v * 100) / 100}`;
}

/** handleSummary(): a short text report (k6 client side + server side) and, with SUMMARY_JSON, the raw data. */
export function summary(name, data) {
  const m = data.metrics;
  const val = (k, f) => (m[k] && m[k].values ? m[k].values[f] : undefined);
  const lines = [];
  const sd = data.setup_data || {};
  lines.push(`\n=== ${name} against ${BASE_URL} (model ${sd.model || '?'}, max_model_len ${sd.maxModelLen || '?'}) ===`);
  lines.push(`requests: ${val('http_reqs', 'count') || 0}, failed: ${fmt(val('http_req_failed', 'rate'))} (rate), ` +
    `completions ok: ${fmt(val('completion_ok', 'rate'))} (rate)`);
  lines.push(`tokens: prompt ${val('prompt_tokens', 'count') || 0}, output ${val('output_tokens', 'count') || 0} ` +
    `(${fmt(val('output_tokens', 'rate'))}/s)`);
  lines.push(`client e2e (whole streamed response): p50 ${fmt(val('completion_e2e_seconds', 'med'), 's')}, ` +
    `p95 ${fmt(val('completion_e2e_seconds', 'p(95)'), 's')}, max ${fmt(val('completion_e2e_seconds', 'max'), 's')}`);
  lines.push(`server TTFT (vllm:time_to_first_token_seconds, this test's share): ` +
    `p50 ${fmt(val('server_ttft_p50_seconds', 'value'), 's')}, p95 ${fmt(val('server_ttft_p95_seconds', 'value'), 's')}, ` +
    `p99 ${fmt(val('server_ttft_p99_seconds', 'value'), 's')}`);
  lines.push(`server ITL p95: ${fmt(val('server_itl_p95_seconds', 'value'), 's')}, ` +
    `preemptions during the test: ${fmt(val('server_preemptions', 'value'))}`);
  let failed = 0;
  for (const [k, v] of Object.entries(m)) {
    for (const [t, r] of Object.entries(v.thresholds || {})) {
      lines.push(`threshold ${k} ${t}: ${r.ok ? 'ok' : 'FAILED'}`);
      if (!r.ok) failed++;
    }
  }
  lines.push(failed ? `${failed} threshold(s) FAILED` : 'all thresholds passed');
  const out = { stdout: lines.join('\n') + '\n' };
  if (__ENV.SUMMARY_JSON) out[__ENV.SUMMARY_JSON] = JSON.stringify(data, null, 2);
  return out;
}
