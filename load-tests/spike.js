// Spike: a steady trickle of requests, then a sudden burst at SPIKE_RATE per second, then back to the trickle.
// Arrivals are open (constant/ramping arrival rate), so a slow server shows as queueing, not as fewer requests.
// k6 run -e BASE_RATE=1 -e SPIKE_RATE=30 -e PHASE=30s load-tests/spike.js
import { baseThresholds, completeOne, setupCommon, summary, teardownCommon } from './lib/common.js';

const BASE_RATE = parseInt(__ENV.BASE_RATE || '1', 10);
const SPIKE_RATE = parseInt(__ENV.SPIKE_RATE || '20', 10);
const PHASE = __ENV.PHASE || '30s';

export const options = {
  scenarios: {
    spike: {
      executor: 'ramping-arrival-rate',
      startRate: BASE_RATE,
      timeUnit: '1s',
      preAllocatedVUs: Math.max(10, SPIKE_RATE * 2),
      maxVUs: parseInt(__ENV.MAX_VUS || String(Math.max(50, SPIKE_RATE * 20)), 10),
      stages: [
        { duration: PHASE, target: BASE_RATE },
        { duration: '2s', target: SPIKE_RATE },
        { duration: PHASE, target: SPIKE_RATE },
        { duration: '2s', target: BASE_RATE },
        { duration: PHASE, target: BASE_RATE },
      ],
    },
  },
  // A spike may push some requests past the usual latency, but none may fail.
  thresholds: baseThresholds({ completion_ok: ['rate>0.99'] }),
};

export const setup = setupCommon;
export const teardown = teardownCommon;
export default completeOne;
export function handleSummary(data) {
  return summary('spike', data);
}
