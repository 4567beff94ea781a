// Ramp: virtual users grow step by step from 1 to MAX_VUS, hold, then ramp down. Each user sends streaming
// completions back to back, so concurrency = users. Watch KV usage, waiting requests and TTFT rise.
// k6 run -e MAX_VUS=64 -e STAGE=30s load-tests/ramp.js
import { baseThresholds, completeOne, setupCommon, summary, teardownCommon } from './lib/common.js';

const MAX_VUS = parseInt(__ENV.MAX_VUS || '64', 10);
const STAGE = __ENV.STAGE || '30s';

export const options = {
  scenarios: {
    ramp: {
      executor: 'ramping-vus',
      startVUs: 1,
      stages: [
        { duration: STAGE, target: Math.max(1, Math.round(MAX_VUS / 4)) },
        { duration: STAGE, target: Math.max(1, Math.round(MAX_VUS / 2)) },
        { duration: STAGE, target: MAX_VUS },
        { duration: STAGE, target: MAX_VUS },
        { duration: STAGE, target: 0 },
      ],
      gracefulRampDown: __ENV.GRACEFUL_RAMP_DOWN || '60s',
    },
  },
  thresholds: baseThresholds(),
};

export const setup = setupCommon;
export const teardown = teardownCommon;
export default completeOne;
export function handleSummary(data) {
  return summary('ramp', data);
}
