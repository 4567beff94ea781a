// Multi-model: several models at once, each with its own open arrival rate, as a shared cluster sees them.
// MODELS is a comma list (default: every id from GET /v1/models); RATES the matching requests/s (default 2
// for the first model and 1 for the others). Point BASE_URL at the Tessera activator, which routes by model,
// or at one tessera vllm-sim started with several --served-model-name values.
// k6 run -e MODELS=llama,qwen -e RATES=4,1 -e DURATION=1m load-tests/multi-model.js
import http from 'k6/http';
import {
  BASE_URL, REQUEST_TIMEOUT, baseThresholds, complete, resolveMaxModelLen, scrape, summary, teardownCommon,
} from './lib/common.js';

const DURATION = __ENV.DURATION || '1m';

/** The server's model cards; MODELS (when set) picks the ones to load. */
function cards() {
  const r = http.get(`${BASE_URL}/v1/models`, { timeout: REQUEST_TIMEOUT });
  if (r.status !== 200) {
    if (__ENV.MODELS) return [];
    throw new Error(`GET ${BASE_URL}/v1/models answered ${r.status}; set MODELS`);
  }
  return r.json('data');
}

function models(list) {
  if (__ENV.MODELS) return __ENV.MODELS.split(',').map((s) => s.trim()).filter(Boolean);
  return list.map((m) => m.id);
}

// The scenario list must be known when the script loads, so MODELS is read from the environment here; without
// it the script runs one scenario per model listed by the server, found in setup() (see default below).
const NAMES = (__ENV.MODELS || '').split(',').map((s) => s.trim()).filter(Boolean);
const RATES = (__ENV.RATES || '').split(',').map((s) => parseInt(s, 10)).filter((n) => n > 0);

const scenarios = {};
const thresholds = baseThresholds();
if (NAMES.length) {
  NAMES.forEach((name, i) => {
    const rate = RATES[i] || (i === 0 ? 2 : 1);
    scenarios[`model_${i}`] = {
      executor: 'constant-arrival-rate',
      rate,
      timeUnit: '1s',
      duration: DURATION,
      preAllocatedVUs: rate * 4,
      maxVUs: rate * 50,
      env: { TARGET_MODEL: name },
      tags: { model: name },
    };
    thresholds[`completion_ok{model:${name}}`] = ['rate>0.99'];
  });
} else {
  scenarios.all_models = {
    executor: 'constant-arrival-rate',
    rate: parseInt(__ENV.RATE || '3', 10),
    timeUnit: '1s',
    duration: DURATION,
    preAllocatedVUs: 12,
    maxVUs: 150,
  };
}

export const options = { scenarios, thresholds };

export function setup() {
  const list = cards();
  const names = models(list);
  // Each model's own context length (MAX_MODEL_LEN, when set, for all).
  const maxModelLens = {};
  names.forEach((n) => { maxModelLens[n] = resolveMaxModelLen(n, list); });
  return { model: names.join(','), models: names, maxModelLens, before: scrape() };
}
export const teardown = teardownCommon;
export default function (data) {
  // With MODELS set, each scenario sends its own model; otherwise requests rotate over the listed models.
  const name = __ENV.TARGET_MODEL || data.models[Math.floor(Math.random() * data.models.length)];
  complete(name, { model: name }, data.maxModelLens[name]);
}
export function handleSummary(data) {
  return summary('multi-model', data);
}
