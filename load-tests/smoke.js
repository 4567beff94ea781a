// Smoke test: a few streaming completions from 2 virtual users; every one must succeed.
// k6 run load-tests/smoke.js   (BASE_URL, MODEL, ... : see lib/common.js)
import { baseThresholds, completeOne, setupCommon, summary, teardownCommon } from './lib/common.js';

export const options = {
  scenarios: {
    smoke: {
      executor: 'shared-iterations',
      vus: parseInt(__ENV.VUS || '2', 10),
      iterations: parseInt(__ENV.ITERATIONS || '10', 10),
      maxDuration: __ENV.MAX_DURATION || '2m',
    },
  },
  thresholds: baseThresholds({
    http_req_failed: ['rate==0'],
    completion_ok: ['rate==1'],
    // The server's own TTFT must be readable (set METRICS_URLS=none, and drop this, for servers without /metrics).
    server_metrics_found: __ENV.METRICS_URLS === 'none' ? [] : ['value==1'],
  }),
};

export const setup = setupCommon;
export const teardown = teardownCommon;
export default completeOne;
export function handleSummary(data) {
  return summary('smoke', data);
}
