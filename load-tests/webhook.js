// Admission latency of `tessera webhook` over TLS, beside the same server's /live at the same rate, in one run.
// Both scenarios are open-loop (constant arrival rate), so a slow answer cannot lower the offered load.
//   k6 run load-tests/webhook.js    (scripts/bench-webhook.sh starts the server and passes these)
//   WEBHOOK_URL  https://127.0.0.1:8443    RATE  500 (per scenario, per second)    DURATION  30s
//   REVIEW       path of the AdmissionReview JSON to POST (default load-tests/webhook-review.json)
//   PROTO        the HTTP version every answer must have come over, default HTTP/1.1: the API server calls
//                admission webhooks with an HTTP/1.1 client and keep-alive (kubernetes/kubernetes#82090), so
//                scripts/bench-webhook.sh runs k6 with GODEBUG=http2client=0; PROTO=HTTP/2.0 without it.
import http from 'k6/http';
import { check } from 'k6';

const base = __ENV.WEBHOOK_URL || 'https://127.0.0.1:8443';
const rate = parseInt(__ENV.RATE || '500', 10);
const duration = __ENV.DURATION || '30s';
const review = open(__ENV.REVIEW || './webhook-review.json');
const proto = __ENV.PROTO || 'HTTP/1.1';

function scenario(exec) {
  return {
    executor: 'constant-arrival-rate',
    exec,
    rate,
    timeUnit: '1s',
    duration,
    preAllocatedVUs: 20,
    maxVUs: 200,
  };
}

export const options = {
  insecureSkipTLSVerify: true,
  discardResponseBodies: false,
  scenarios: { mutate: scenario('mutate'), live: scenario('live') },
  summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
  thresholds: {
    'http_req_duration{scenario:mutate}': ['p(99)<5'],
    'http_req_duration{scenario:live}': ['p(99)<5'],
    'checks{scenario:mutate}': ['rate==1'],
    'checks{scenario:live}': ['rate==1'],
    dropped_iterations: ['count==0'],
    'http_reqs{scenario:mutate}': ['count>0'],
  },
};

export function mutate() {
  const r = http.post(`${base}/mutate`, review, { headers: { 'content-type': 'application/json' } });
  check(r, {
    'mutated: 200 with a JSON patch': (res) => res.status === 200 && res.body.indexOf('"patchType":"JSONPatch"') >= 0,
    [`mutate over ${proto}`]: (res) => res.proto === proto,
  });
}

export function live() {
  const r = http.get(`${base}/live`);
  check(r, { 'live: 200': (res) => res.status === 200, [`live over ${proto}`]: (res) => res.proto === proto });
}

export function handleSummary(data) {
  const m = data.metrics;
  const p99 = (s) => m[`http_req_duration{scenario:${s}}`].values['p(99)'];
  const med = (s) => m[`http_req_duration{scenario:${s}}`].values.med;
  const out = {
    rate_per_scenario: rate,
    proto,
    duration,
    mutate_requests: m['http_reqs{scenario:mutate}'] ? m['http_reqs{scenario:mutate}'].values.count : null,
    mutate_p50_ms: med('mutate'),
    mutate_p99_ms: p99('mutate'),
    live_p50_ms: med('live'),
    live_p99_ms: p99('live'),
    added_p99_ms: p99('mutate') - p99('live'),
    dropped_iterations: m.dropped_iterations ? m.dropped_iterations.values.count : 0,
    checks_passed: m.checks.values.rate,
  };
  const line = JSON.stringify(out);
  return { stdout: `${line}\n`, [__ENV.SUMMARY || 'webhook-summary.json']: line };
}
