// Scale from zero: IDLE with no traffic at all (long enough for the autoscaler to scale the model to zero),
// then a burst of BURST requests at once. Behind the Tessera activator the burst is held while a replica
// starts, so every request must still succeed; REQUEST_TIMEOUT must cover the cold start.
// k6 run -e IDLE=6m -e BURST=20 -e REQUEST_TIMEOUT=300s load-tests/scale-from-zero.js
import { sleep } from 'k6';
import { Trend } from 'k6/metrics';
import { baseThresholds, complete, setupCommon, summary, teardownCommon } from './lib/common.js';

const IDLE = __ENV.IDLE || '30s';
const BURST = parseInt(__ENV.BURST || '20', 10);
const burstLatency = new Trend('burst_e2e_seconds');

function seconds(d) {
  const m = String(d).match(/^(\d+(?:\.\d+)?)(ms|s|m|h)?$/);
  if (!m) throw new Error(`IDLE=${d} is not a duration like 30s or 6m`);
  const n = parseFloat(m[1]);
  return { ms: n / 1000, s: n, m: n * 60, h: n * 3600 }[m[2] || 's'];
}

export const options = {
  scenarios: {
    burst: {
      executor: 'per-vu-iterations',
      vus: BURST,
      iterations: 1,
      startTime: IDLE,
      maxDuration: __ENV.MAX_DURATION || '10m',
    },
  },
  thresholds: baseThresholds({
    completion_ok: ['rate==1'],
    http_req_failed: ['rate==0'],
    // The burst includes the cold start: bounded by BURST_P95_MAX seconds (default 300).
    burst_e2e_seconds: [`p(95)<${parseFloat(__ENV.BURST_P95_MAX || '300')}`],
  }),
};

export function setup() {
  const data = setupCommon();
  data.idleSeconds = seconds(IDLE);
  return data;
}
export const teardown = teardownCommon;
export default function (data) {
  const t0 = Date.now();
  complete(data.model, undefined, data.maxModelLen);
  burstLatency.add((Date.now() - t0) / 1000);
  sleep(0);
}
export function handleSummary(data) {
  return summary('scale-from-zero', data);
}
