//! Measures what the activator costs, as real processes on loopback (run by `scripts/bench-activator.sh`).
//!
//! 1. **Proxy overhead**, side by side in one run: an open-loop generator sends, at every tick of a fixed rate, one
//!    request straight to a minimal OpenAI-style backend and one through `tessera activator` to the same backend.
//!    Latency is measured from each request's *scheduled* send time to the end of its body (so a stalled generator
//!    cannot hide queueing: no coordinated omission). Reported: p50/p90/p99/max per path, the added p50/p99, and
//!    the median of the per-tick paired differences.
//! 2. **Scale from zero**: a fresh activator holds a request for a backend that is not running; the backend process
//!    is then started and logs the instant its listener is bound (ready). Reported: time from that instant to the
//!    held request's response headers, over several trials.
//!
//! The backend is this same executable (`activator_overhead backend`), a separate process so that the generator,
//! the activator and the backend each have their own runtime, as in production; or, with `--emulator`, a
//! `tessera vllm-sim` process (the emulated vLLM the rest of the tests use). `--rates 200,1000,2000` runs the
//! overhead measurement once per rate, with the activator's load shedding on (`--max-in-flight`, `--max-held`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve a minimal OpenAI chat-completions backend (no model: a fixed reply, so only the network path is timed).
    Backend {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
    /// Run both measurements and print a Markdown report.
    Run {
        /// The `tessera` binary to measure.
        #[arg(long)]
        tessera: String,
        /// Requests per second on each path; several (comma-separated) run one after the other.
        #[arg(long = "rates", alias = "rate", value_delimiter = ',', default_value = "200")]
        rates: Vec<u32>,
        /// Use `tessera vllm-sim` (fast time scale) as the backend instead of the minimal one.
        #[arg(long)]
        emulator: bool,
        /// The activator's `--max-in-flight` (load shedding bound) during the overhead runs.
        #[arg(long, default_value_t = 4096)]
        max_in_flight: u64,
        /// How long to send.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
        duration: Duration,
        /// Scale-from-zero trials.
        #[arg(long, default_value_t = 20)]
        trials: u32,
    },
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

const REPLY: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"The quick brown fox jumps over the lazy dog."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":10,"total_tokens":22}}"#;

async fn backend(listen: SocketAddr) {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            post(|_body: Bytes| async { ([(http::header::CONTENT_TYPE, "application/json")], REPLY) }),
        );
    let listener = tokio::net::TcpListener::bind(listen).await.expect("bind backend");
    let addr = listener.local_addr().expect("addr");
    // Ready means: the listener is bound, so a connection from now on is accepted and served.
    println!(
        "{{\"addr\":\"{addr}\",\"ready_unix_ns\":{}}}",
        unix_ns(SystemTime::now())
    );
    axum::serve(listener, app).await.expect("serve");
}

/// Starts the backend process and returns it with its address and ready instant (Unix ns).
fn start_backend(listen: &str) -> (Proc, SocketAddr, u128) {
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .args(["backend", "--listen", listen])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn backend");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("backend ready line");
    let v: serde_json::Value = serde_json::from_str(&line).expect("backend ready JSON");
    let addr = v["addr"].as_str().expect("addr").parse().expect("addr parses");
    let ready = v["ready_unix_ns"].as_u64().expect("ready time") as u128;
    (Proc(child), addr, ready)
}

/// Starts `tessera --log-format json <args>` with `RUST_LOG=<log>` and returns it with the address it bound (the
/// `listen` field of its JSON log).
fn start_role(tessera: &str, args: &[String], log: &str) -> (Proc, SocketAddr) {
    let mut child = Command::new(tessera)
        .args(["--log-format", "json"])
        .args(args)
        .env("RUST_LOG", log)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tessera");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && let Some(a) = v["fields"]["listen"].as_str()
            {
                let _ = tx.send(a.parse::<SocketAddr>().expect("listen addr"));
                sent = true;
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| {
        panic!(
            "tessera {} did not start",
            args.first().map_or("", String::as_str)
        )
    });
    (Proc(child), addr)
}

/// Starts `tessera activator` and returns it with its address.
fn start_activator(tessera: &str, extra: &[String]) -> (Proc, SocketAddr) {
    // The admin listener (stats, metrics) on an ephemeral port too: its default 9090 may be taken.
    let mut args: Vec<String> = [
        "activator",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    args.extend_from_slice(extra);
    start_role(tessera, &args, "warn,tessera_activator=info")
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(c)
}

const BODY: &str =
    r#"{"model":"bench","messages":[{"role":"user","content":"Say something short."}],"max_tokens":16}"#;

/// One request; returns (time to response headers, time to end of body), both from `from`.
async fn one(client: &HttpClient, url: &str, from: Instant) -> Result<(Duration, Duration), String> {
    let req = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let headers = from.elapsed();
    let status = resp.status();
    resp.into_body().collect().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("status {status}"));
    }
    Ok((headers, from.elapsed()))
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Starts `tessera vllm-sim` serving `bench` 1000× faster than real time, so a request's own latency stays far below
/// the proxy's and the comparison measures the network path.
fn start_emulator(tessera: &str) -> (Proc, SocketAddr) {
    let args = [
        "vllm-sim",
        "--listen",
        "127.0.0.1:0",
        "--served-model-name",
        "bench",
        "--model-preset",
        "opt-125m",
        "--time-scale",
        "1000",
    ]
    .map(String::from);
    start_role(tessera, &args, "info")
}

async fn overhead(tessera: &str, rate: u32, duration: Duration, emulator: bool, max_in_flight: u64) {
    let (_backend, backend_addr) = if emulator {
        start_emulator(tessera)
    } else {
        let (p, a, _) = start_backend("127.0.0.1:0");
        (p, a)
    };
    let (_act, act_addr) = start_activator(
        tessera,
        &[
            format!("--backend=bench=http://{backend_addr}"),
            format!("--max-in-flight={max_in_flight}"),
        ],
    );
    let direct = format!("http://{backend_addr}/v1/chat/completions");
    let via = format!("http://{act_addr}/v1/chat/completions");
    let client = Arc::new(client());
    // Warm up both paths (connection pools, the activator's first probe) before measuring.
    for _ in 0..200 {
        one(&client, &direct, Instant::now())
            .await
            .expect("direct warm-up");
        one(&client, &via, Instant::now())
            .await
            .expect("activator warm-up");
    }
    let n = (rate as f64 * duration.as_secs_f64()) as usize;
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let start = Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let scheduled = start + period * i as u32;
        tokio::time::sleep_until(scheduled.into()).await;
        let (c, d, v) = (client.clone(), direct.clone(), via.clone());
        // Alternate which path goes first so neither always gets the fresher moment.
        tasks.push(tokio::spawn(async move {
            let (a, b) = if i % 2 == 0 {
                let a = one(&c, &d, scheduled);
                let b = one(&c, &v, scheduled);
                tokio::join!(a, b)
            } else {
                let b = one(&c, &v, scheduled);
                let a = one(&c, &d, scheduled);
                let (b, a) = tokio::join!(b, a);
                (a, b)
            };
            (a, b)
        }));
    }
    let (mut d_lat, mut v_lat, mut diffs, mut errors) = (Vec::new(), Vec::new(), Vec::new(), 0usize);
    for t in tasks {
        match t.await.expect("task") {
            (Ok((_, a)), Ok((_, b))) => {
                d_lat.push(a);
                v_lat.push(b);
                diffs.push(ms(b) - ms(a));
            }
            (a, b) => {
                errors += 1;
                eprintln!("error: direct {:?} via activator {:?}", a.err(), b.err());
            }
        }
    }
    let sent_for = start.elapsed();
    d_lat.sort();
    v_lat.sort();
    diffs.sort_by(|a, b| a.total_cmp(b));
    let paired_median = diffs.get(diffs.len() / 2).copied().unwrap_or(0.0);
    let backend_name = if emulator {
        "tessera vllm-sim"
    } else {
        "minimal backend"
    };
    println!(
        "### Proxy overhead: {rate} req/s on each path for {duration:?}, {backend_name}, --max-in-flight \
         {max_in_flight} ({n} pairs, {errors} errors)\n"
    );
    println!("| path | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    for (name, l) in [("direct", &d_lat), ("through activator", &v_lat)] {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:.3} |",
            ms(quantile(l, 0.5)),
            ms(quantile(l, 0.9)),
            ms(quantile(l, 0.99)),
            ms(quantile(l, 1.0))
        );
    }
    println!(
        "\nadded by the activator: p50 {:+.3} ms, p99 {:+.3} ms; median of per-tick paired differences {:+.3} ms \
         (wall time {:.1} s)\n",
        ms(quantile(&v_lat, 0.5)) - ms(quantile(&d_lat, 0.5)),
        ms(quantile(&v_lat, 0.99)) - ms(quantile(&d_lat, 0.99)),
        paired_median,
        sent_for.as_secs_f64()
    );
}

async fn scale_from_zero(tessera: &str, trials: u32) {
    let client = client();
    let mut deltas = Vec::new();
    for trial in 0..trials {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("probe port")
            .local_addr()
            .expect("addr")
            .port();
        let (_act, act_addr) =
            start_activator(tessera, &[format!("--backend=bench=http://127.0.0.1:{port}")]);
        let via = format!("http://{act_addr}/v1/chat/completions");
        let held = {
            let c = client.clone();
            tokio::spawn(async move {
                let from = Instant::now();
                let r = one(&c, &via, from).await;
                (r, SystemTime::now())
            })
        };
        // Let the request be held and the activator settle into its held-probe rhythm, then vary the phase so
        // the backend does not always turn ready at the same point of a probe interval.
        tokio::time::sleep(Duration::from_millis(300 + u64::from(trial * 37 % 50))).await;
        let (_backend, _, ready_ns) = start_backend(&format!("127.0.0.1:{port}"));
        let (result, done_at) = held.await.expect("held task");
        let (headers, total) = result.expect("held request succeeded");
        // Response headers arrive `total - headers` before the body end; use the header instant.
        let headers_at_ns = unix_ns(done_at) - (total - headers).as_nanos();
        deltas.push(Duration::from_nanos(
            (headers_at_ns.saturating_sub(ready_ns)) as u64,
        ));
    }
    deltas.sort();
    println!("### Scale from zero: backend ready → held request's response headers ({trials} trials)\n");
    println!("| p50 ms | p90 ms | max ms |");
    println!("|---|---|---|");
    println!(
        "| {:.1} | {:.1} | {:.1} |\n",
        ms(quantile(&deltas, 0.5)),
        ms(quantile(&deltas, 0.9)),
        ms(quantile(&deltas, 1.0))
    );
}

#[tokio::main]
async fn main() {
    match Cli::parse().command {
        Cmd::Backend { listen } => backend(listen).await,
        Cmd::Run {
            tessera,
            rates,
            emulator,
            max_in_flight,
            duration,
            trials,
        } => {
            for rate in rates {
                overhead(&tessera, rate, duration, emulator, max_in_flight).await;
            }
            if trials > 0 {
                scale_from_zero(&tessera, trials).await;
            }
        }
    }
}
