//! Every metric a Grafana dashboard in `deploy/grafana/` queries must be one the roles really emit. The names are
//! collected from the real roles' `/metrics` over loopback (the emulator for `vllm:*`, the sidecar, the activator
//! — with a request held while its model has no ready backend, so the hold histogram exists — the webhook after
//! one real admission over TLS, the gpu-agent and the autoscaler's local mode), plus the autoscaler controller's
//! own registry, pool manager included, exercised in-process (its labelled families only appear once they have a
//! sample, and no API server runs here to make the controller decide or the pool manager place).

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use support::{Tessera, admission, free_port};
use tessera_core::scale::ScaleReason;

/// Sample and family names on an exposition page. A family a role registered but has not counted anything in yet
/// (the webhook's admissions before the first pod, a pool's reservations before the first placement) shows only
/// as `# TYPE <family> <type>`: its samples' names follow from the type as OpenMetrics defines them (`_total` for a
/// counter; `_bucket`, `_sum`, `_count` for a histogram), so those count as emitted too.
fn names(page: &str, into: &mut BTreeSet<String>) {
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(family), kind) = (parts.next(), parts.next()) else {
                continue;
            };
            into.insert(family.to_owned());
            let suffixes: &[&str] = match kind {
                Some("counter") => &["_total"],
                Some("histogram") => &["_bucket", "_sum", "_count"],
                _ => &[],
            };
            for s in suffixes {
                if !family.ends_with(s) {
                    into.insert(format!("{family}{s}"));
                }
            }
        } else if !line.starts_with('#')
            && let Some(n) = line.split(['{', ' ']).next().filter(|n| !n.is_empty())
        {
            into.insert(n.to_owned());
        }
    }
}

/// Metric names in a PromQL expression: identifiers starting `tessera_` or `vllm:`.
fn queried(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts = expr[i..].starts_with("tessera_") || expr[i..].starts_with("vllm:");
        let boundary =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
        if starts && boundary {
            let end = expr[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(expr.len(), |e| i + e);
            out.push(expr[i..end].to_owned());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                if k == "expr"
                    && let Some(s) = x.as_str()
                {
                    out.push(s.to_owned());
                }
                exprs(x, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

async fn get(client: &reqwest::Client, url: &str) -> String {
    let r = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert!(r.status().is_success(), "GET {url}: {}", r.status());
    r.text().await.expect("body")
}

#[test]
fn a_family_without_samples_emits_the_names_its_type_defines() {
    let mut got = BTreeSet::new();
    names(
        "# HELP tessera_pool_reservations Reservation calls.\n# TYPE tessera_pool_reservations counter\n\
         # TYPE tessera_webhook_admission_duration_seconds histogram\n# TYPE tessera_up gauge\n\
         tessera_up 1\n",
        &mut got,
    );
    for n in [
        "tessera_pool_reservations_total",
        "tessera_webhook_admission_duration_seconds_bucket",
        "tessera_webhook_admission_duration_seconds_count",
        "tessera_up",
    ] {
        assert!(got.contains(n), "{n} in {got:?}");
    }
    assert!(!got.contains("tessera_up_total"), "a gauge has no _total");
    assert!(!got.contains("tessera_pool_reservations_bucket"));
}

/// The chart ships the dashboards as ConfigMaps from its own copies (`charts/tessera/files/dashboards/`): they must be
/// `deploy/grafana/`'s, byte for byte (`scripts/check-chart.sh` also checks the rendered ConfigMaps).
#[test]
fn the_chart_ships_the_same_dashboards() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let list = |dir: &str| -> Vec<(String, String)> {
        let mut files: Vec<(String, String)> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .map(|p| {
                let name = p.file_name().expect("a name").to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&p).expect("read"))
            })
            .collect();
        files.sort();
        files
    };
    let deploy = list("deploy/grafana");
    assert_eq!(deploy.len(), 2);
    assert!(
        list("charts/tessera/files/dashboards") == deploy,
        "charts/tessera/files/dashboards/ differs from deploy/grafana/: cp deploy/grafana/*.json charts/tessera/files/dashboards/"
    );
}

#[test]
fn the_expression_parser_finds_every_metric_name() {
    assert_eq!(
        queried("sum by (model_name) (rate(vllm:prefix_cache_hits_total[5m])) / sum(tessera_stale)"),
        ["vllm:prefix_cache_hits_total", "tessera_stale"]
    );
    assert!(queried("histogram_quantile(0.95, sum by (le) (x))").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
async fn every_dashboard_metric_is_emitted_by_a_role() {
    let client = reqwest::Client::new();
    let mut emitted = BTreeSet::new();

    // vLLM (emulated) with traffic, and its sidecar.
    let vllm = Tessera::vllm_sim(&["--model-preset", "opt-125m", "--served-model-name", "chat"]);
    let body = serde_json::json!({"model": "chat", "prompt": "hello", "max_tokens": 5});
    let r = support::post_json(&client, &vllm.url("/v1/completions"), &body).await;
    assert!(r.status().is_success());
    let sidecar = Tessera::sidecar(
        &vllm.base(),
        &[
            "--scrape-interval",
            "200ms",
            "--min-window",
            "1s",
            "--min-samples",
            "3",
            "--gpu-memory-mib",
            "81920",
            "--bytes-per-kv-token",
            "36864",
        ],
    );
    // Wait until the sidecar exports its recommendation gauges.
    let mut page = String::new();
    for _ in 0..100 {
        page = get(&client, &sidecar.url("/metrics")).await;
        if page.contains("tessera_recommended_gpu_memory_mib") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        page.contains("tessera_recommended_gpu_memory_mib"),
        "the sidecar exported no recommendation within 10 s: {}",
        get(&client, &sidecar.url("/v1/status")).await
    );
    names(&page, &mut emitted);
    names(&get(&client, &vllm.url("/metrics")).await, &mut emitted);

    // The activator: one request routed, one unknown model, one held until its backend comes up.
    let later_port = free_port();
    let activator = Tessera::start(&[
        "activator",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        &format!("chat={}", vllm.base()),
        "--backend",
        &format!("later=http://127.0.0.1:{later_port}"),
    ]);
    let post = |model: &'static str| {
        let c = client.clone();
        let url = activator.url("/v1/completions");
        async move {
            c.post(url)
                .json(&serde_json::json!({"model": model, "prompt": "hi", "max_tokens": 3}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    };
    assert_eq!(post("chat").await.ok(), Some(200));
    assert_eq!(post("nope").await.ok(), Some(404));
    let held = tokio::spawn(post("later"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _later = Tessera::vllm_sim_at(
        &format!("127.0.0.1:{later_port}"),
        &["--model-preset", "opt-125m", "--served-model-name", "later"],
    );
    let status = tokio::time::timeout(Duration::from_secs(30), held)
        .await
        .expect("the held request was answered")
        .expect("task");
    assert_eq!(
        status.ok(),
        Some(200),
        "the held request was served once its backend came up"
    );
    names(
        &get(&client, &activator.admin_url("/metrics")).await,
        &mut emitted,
    );

    // The webhook without a cluster (a self-signed certificate made here), after one real admission over TLS: its
    // admission families have samples only once a pod was admitted.
    let tls = tempfile::tempdir().expect("tempdir");
    let pair = admission::pair();
    let webhook_metrics = format!("127.0.0.1:{}", free_port());
    let webhook = admission::start_webhook(tls.path(), &pair, &webhook_metrics, &[]);
    let mut stream = admission::connect(&admission::connector(&[&pair.der]), webhook.addr).await;
    let (status, answer) = admission::exchange(
        &mut stream,
        "POST",
        "/mutate",
        &admission::review("dashboards", admission::real_pod()),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    let page = get(&client, &format!("http://{webhook_metrics}/metrics")).await;
    assert!(page.contains("tessera_webhook_admissions_total{"), "{page}");
    names(&page, &mut emitted);

    // The gpu-agent (no NVML here: its health gauges) and the autoscaler in local mode.
    let agent = Tessera::start(&["gpu-agent", "--listen", "127.0.0.1:0"]);
    names(&get(&client, &agent.url("/metrics")).await, &mut emitted);
    let ui = Tessera::start(&[
        "autoscaler",
        "--no-kube",
        "--metrics-listen",
        "127.0.0.1:0",
        "--sidecar",
        &format!("chat={}", sidecar.base()),
    ]);
    names(&get(&client, &ui.url("/metrics")).await, &mut emitted);

    // The controller's registry, every family given a sample.
    let m = tessera_autoscaler::controller::metrics::Metrics::new();
    m.decision(ScaleReason::ScaleUp);
    m.scaled(1, 2);
    m.reconcile_took(0.01);
    m.reconcile_error("get_scale");
    m.scrape_failure("sidecar", "timeout");
    m.set_leader(true);
    m.budget_group(
        "tools",
        &tessera_core::scale::coldstart::GroupSpend {
            group: "batch-tools".into(),
            members: 2,
            requests: 1000,
            budget: 0.01,
            allowance: 10,
            spent: 4,
            allotted: true,
            own_misses: 4,
        },
    );
    // Its pool manager's families (the webhook registers the same ones): placing needs a cluster.
    m.pool.reservation("a100", "placed");
    m.pool.conflict("a100");
    m.pool.expired("a100", 1);
    m.pool.deleted("a100");
    m.pool.capacity_pods("a100", 2);
    names(&m.encode(), &mut emitted);

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana");
    let mut checked = 0;
    let mut missing = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("deploy/grafana")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "two dashboards: {files:?}");
    for file in &files {
        let dashboard: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file).expect("read")).expect("valid JSON");
        assert!(
            dashboard["uid"].is_string() && dashboard["title"].is_string(),
            "{}",
            file.display()
        );
        let mut all = Vec::new();
        exprs(&dashboard, &mut all);
        assert!(!all.is_empty(), "{} has queries", file.display());
        for e in all {
            let names = queried(&e);
            assert!(
                !names.is_empty(),
                "{}: a query with no tessera_/vllm: metric: {e}",
                file.display()
            );
            for n in names {
                checked += 1;
                if !emitted.contains(&n) {
                    missing.push(format!("{}: {n} (in {e})", file.display()));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "dashboard metrics no role emits:\n{}\n\nemitted:\n{emitted:#?}",
        missing.join("\n")
    );
    assert!(checked > 30, "only {checked} names checked");
}
