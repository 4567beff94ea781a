//! The harness every binary test shares: start a `tessera` role as a real child process on an ephemeral port, learn
//! the address it bound from its JSON log (every serving role logs it in the field `listen`; the activator its
//! admin listener beside it, in `admin_listen`), and kill it on drop so a failing test never leaves a server behind.
//!
//! Every child gets `TESSERA_ADMIN_LISTEN=127.0.0.1:0`: the activator's admin listener then takes an ephemeral
//! port too (its default, 9090, would collide between tests running at once). A test's own environment or an
//! `--admin-listen` flag overrides it.
//!
//! Set `TESSERA_TEST_LOGS=1` to see the children's logs.
#![allow(dead_code)] // each test crate uses a different part of it

/// Admission requests to `tessera webhook` over TLS, as the API server makes them.
pub mod admission;
/// The in-memory Kubernetes API server (watch streams, selectors, resourceVersion, 409s).
pub mod apiserver;
/// The Batch API's client side: upload, create, poll.
pub mod batch;
/// A kube client from a kubeconfig and polling a real cluster (the control-plane and real-node tiers).
pub mod cluster;
/// A control plane of its own from `scripts/control-plane.sh up`, stopped on drop.
pub mod control_plane;
/// A CA with a server and a client certificate, for TLS with client certificates.
pub mod pki;
pub mod pool;
/// Real-time streaming load and its TTFT percentiles (the lanes and batch tests).
pub mod realtime;
/// A replica in sleep mode and the kubelet the controller's sleep tests play.
pub mod sleep;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// How long a child may take to bind its port (a cold debug binary on a loaded 2-core machine is slow).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `tessera` child, killed on drop.
#[derive(Debug)]
pub struct Tessera {
    pub child: Child,
    pub addr: SocketAddr,
    /// The admin listener's address, for a role that logs one (`admin_listen`: the activator's stats and metrics).
    pub admin: Option<SocketAddr>,
}

impl Drop for Tessera {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child started by the test itself (with its own flags and environment), killed on drop.
#[derive(Debug)]
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `tessera <args>`, which must refuse to start (a bad flag or configuration); returns its stderr.
pub fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("run tessera");
    assert!(!out.status.success(), "tessera {args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `tessera simulate <args>` (in `dir`, where one is given) and waits at most `limit` for it to exit; one
/// still running then is killed and the test fails.
pub fn simulate(dir: Option<&std::path::Path>, args: &[&str], limit: Duration) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.arg("simulate")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().expect("spawn tessera");
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().expect("wait for tessera simulate").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tessera simulate {args:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("tessera simulate's output")
}

/// The file at `relative` in the shared workplace (`../shared`, outside the project), or `None` with a SKIP line
/// on stderr where it is absent.
pub fn shared_file(relative: &str) -> Option<std::path::PathBuf> {
    let path = workspace().join("../shared").join(relative);
    if path.exists() {
        return Some(path);
    }
    eprintln!(
        "SKIP: {} is absent (the shared workplace's files live outside the project)",
        path.display()
    );
    None
}

/// Serves `app` on an ephemeral loopback port for the rest of the test; returns the address.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

impl Tessera {
    /// Runs `tessera --log-format json <args>` with `RUST_LOG=info` and blocks until it logs its bound address.
    /// `args` must include the role's `--listen` (usually `127.0.0.1:0`).
    pub fn start(args: &[&str]) -> Tessera {
        Self::start_with_env(args, &[])
    }

    /// `tessera sidecar --vllm-url <vllm_url> --listen 127.0.0.1:0 <extra>`.
    pub fn sidecar(vllm_url: &str, extra: &[&str]) -> Tessera {
        let mut args = vec!["sidecar", "--vllm-url", vllm_url, "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        Self::start(&args)
    }

    /// The sidecar on `vllm_url`, scraping every 100 ms with a short window (1 m, 5 samples, 300 ms) so it
    /// recommends within a second, without NVML; `extra` adds the memory facts and anything else, `env` the
    /// environment.
    pub fn quick_sidecar(vllm_url: &str, extra: &[&str], env: &[(&str, &str)]) -> Tessera {
        Self::quick_sidecar_at(vllm_url, "127.0.0.1:0", extra, env)
    }

    /// As [`Tessera::quick_sidecar`], listening on `listen` (a port a test names in advance).
    pub fn quick_sidecar_at(vllm_url: &str, listen: &str, extra: &[&str], env: &[(&str, &str)]) -> Tessera {
        let mut args = vec![
            "sidecar",
            "--vllm-url",
            vllm_url,
            "--listen",
            listen,
            "--scrape-interval",
            "100ms",
            "--window",
            "1m",
            "--min-samples",
            "5",
            "--min-window",
            "300ms",
            "--no-nvml",
        ];
        args.extend_from_slice(extra);
        Self::start_with_env(&args, env)
    }

    /// The emulator with vLLM's sleep mode served (`--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1`), serving
    /// `m`; `extra` adds flags.
    pub fn sleep_mode_sim(extra: &[&str]) -> Tessera {
        let mut args = vec![
            "vllm-sim",
            "--listen",
            "127.0.0.1:0",
            "--served-model-name",
            "m",
            "--enable-sleep-mode",
        ];
        args.extend_from_slice(extra);
        Tessera::start_with_env(&args, &[("VLLM_SERVER_DEV_MODE", "1")])
    }

    /// [`Tessera::sleep_mode_sim`] as opt-125m at 100× speed, waking in 300 ms and keeping 1.4 GiB (an H100's
    /// level-1 residue) while asleep.
    pub fn sleepy_sim(extra: &[&str]) -> Tessera {
        let mut args = vec![
            "--model-preset",
            "opt-125m",
            "--time-scale",
            "100",
            "--wake-up-delay",
            "300ms",
            "--fault-sleep-residue-bytes",
            "1503238553",
        ];
        args.extend_from_slice(extra);
        Self::sleep_mode_sim(&args)
    }

    /// [`Tessera::quick_sidecar`] on `emu` taking its sleep instructions from the annotations file `file` (read every
    /// 50 ms, settling 200 ms); `extra` adds flags.
    pub fn rest_sidecar(emu: &Tessera, file: &std::path::Path, extra: &[&str]) -> Tessera {
        let mut args = vec![
            "--rest-file",
            file.to_str().expect("a UTF-8 path"),
            "--rest-poll",
            "50ms",
            "--rest-settle",
            "200ms",
        ];
        args.extend_from_slice(extra);
        Self::quick_sidecar(&emu.base(), &args, &[])
    }

    /// As [`Tessera::start`], with extra environment variables.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Tessera {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["--log-format", "json"])
            .args(args)
            .env("RUST_LOG", "info")
            .env("TESSERA_ADMIN_LISTEN", "127.0.0.1:0")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tessera");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            // Keep draining after the address is found so the child never blocks on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent
                    && let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && let Some(addr) = v["fields"]["listen"]
                        .as_str()
                        .and_then(|a| a.parse::<SocketAddr>().ok())
                {
                    let admin = v["fields"]["admin_listen"]
                        .as_str()
                        .and_then(|a| a.parse::<SocketAddr>().ok());
                    let _ = tx.send((addr, admin));
                    sent = true;
                }
                if std::env::var_os("TESSERA_TEST_LOGS").is_some() {
                    eprintln!("{line}");
                }
            }
        });
        match rx.recv_timeout(START_TIMEOUT) {
            Ok((addr, admin)) => Tessera { child, addr, admin },
            Err(_) => {
                let _ = child.kill();
                panic!("tessera {args:?} did not log its listen address within {START_TIMEOUT:?}");
            }
        }
    }

    /// Runs `tessera vllm-sim --listen 127.0.0.1:0 <args>`: the emulator, on an ephemeral port.
    pub fn vllm_sim(args: &[&str]) -> Tessera {
        Self::vllm_sim_at("127.0.0.1:0", args)
    }

    /// The emulator listening on `listen` (a port a test named in advance: a backend that comes up late).
    pub fn vllm_sim_at(listen: &str, args: &[&str]) -> Tessera {
        let mut all = vec!["vllm-sim", "--listen", listen];
        all.extend_from_slice(args);
        Self::start(&all)
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `http://<addr>`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://<admin address><path>`: the activator's stats and `/metrics` (panics for a role without one).
    pub fn admin_url(&self, path: &str) -> String {
        format!("{}{}", self.admin_base(), path)
    }

    /// `http://<admin address>`, what the autoscaler's `--activator-url` takes.
    pub fn admin_base(&self) -> String {
        let admin = self
            .admin
            .expect("this role logged no admin_listen address (only the activator has an admin listener)");
        format!("http://{admin}")
    }
}

/// The workspace root (this crate's parent folder), where `scripts/`, `testdata/` and `.tools/` are.
pub fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The k6 binary: `scripts/test.sh` installs it under `.tools/venv/bin`, else the first on `PATH`.
pub fn find_k6() -> Option<std::path::PathBuf> {
    let local = workspace().join(".tools/venv/bin/k6");
    if local.is_file() {
        return Some(local);
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join("k6"))
        .find(|p| p.is_file())
}

/// A port that is free now, for a server that must come up later on a known address. It is picked below the
/// kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`), where every `127.0.0.1:0` bind lands, and
/// never handed out twice by this process: a port from the ephemeral range (what `bind(0)` gives) could go to a
/// listener of a test running beside this one before the child binds it (seen once: a controller that exited at
/// start on its metrics port). Each process starts its walk at a place of its own, so two test binaries running at
/// once seldom meet, and a port something else holds fails the bind check and is skipped.
pub fn free_port() -> u16 {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    const FLOOR: u32 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|&low| low > FLOOR + 1_000)
        .unwrap_or(32_768);
    let span = ephemeral_low - FLOOR;
    let start = std::process::id().wrapping_mul(7_919) % span;
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..span {
        let port = u16::try_from(FLOOR + (start + i) % span).expect("below the ephemeral range");
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    panic!("no free port between {FLOOR} and {ephemeral_low} on 127.0.0.1");
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`, …); `None` when the process or the field is gone.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Sends SIGTERM to `child` (through `kill`, which every test machine has).
pub fn sigterm(child: &Child) {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -TERM {} failed", child.id());
}

/// Sends SIGTERM to `child` and waits for it to exit, at most `within` (then kills it and panics). Polls with
/// tokio's sleep so servers the test runs in-process (a fake API the child talks to on its way out) keep serving.
pub async fn terminate(child: &mut Child, within: Duration) -> ExitStatus {
    sigterm(child);
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("pid {} did not exit within {within:?} of SIGTERM", child.id());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An HTTP client for tests: every request is bounded by `timeout`.
pub fn http_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .expect("a reqwest client")
}

/// The first sample of `name` on the `/metrics` page at `url`; `None` when the page cannot be read (the server is
/// not up, or went away) or has no such series.
pub async fn first_sample(url: &str, name: &str) -> Option<f64> {
    let text = http_client(Duration::from_secs(5))
        .get(url)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// GETs `url` (panics when no response comes: a test helper); the response, whatever its status.
pub async fn get(client: &reqwest::Client, url: &str) -> reqwest::Response {
    client.get(url).send().await.expect("GET")
}

/// GETs `url` and parses the body as JSON (panics on any failure: a test helper).
pub async fn get_json(client: &reqwest::Client, url: &str) -> serde_json::Value {
    client
        .get(url)
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("a JSON body")
}

/// The sum of every sample of the series whose line starts with `name` on a Prometheus text page (0 when none
/// does), e.g. `vllm:request_success_total` summed over finish reasons.
pub fn metric_sum(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// POSTs `body` as JSON to `url` and returns the response, whatever its status (panics when no response comes: a
/// test helper).
pub async fn post_json(client: &reqwest::Client, url: &str, body: &serde_json::Value) -> reqwest::Response {
    client.post(url).json(body).send().await.expect("POST")
}

/// GETs `url` and returns the body as text (panics on any failure: a test helper), e.g. a `/metrics` page.
pub async fn get_text(client: &reqwest::Client, url: &str) -> String {
    client
        .get(url)
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("a text body")
}

impl Tessera {
    /// Starts `tessera activator --listen 127.0.0.1:0 <extra>`.
    pub fn activator(extra: &[&str]) -> Tessera {
        let mut args = vec!["activator", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        Tessera::start(&args)
    }

    /// [`Tessera::activator`] with `backend` (`model=url`) as its first `--backend`.
    pub fn activator_for(backend: &str, extra: &[&str]) -> Tessera {
        let mut args = vec!["--backend", backend];
        args.extend_from_slice(extra);
        Tessera::activator(&args)
    }

    /// [`Tessera::activator_for`] with `model`'s backend on the loopback `port`, where nothing may listen yet.
    pub fn activator_at_port(model: &str, port: u16, extra: &[&str]) -> Tessera {
        Tessera::activator_for(&format!("{model}=http://127.0.0.1:{port}"), extra)
    }

    /// [`Tessera::activator`] for the model `m` served by `emu`, waking it through its sidecar `sidecar`.
    pub fn waking_activator(emu: &Tessera, sidecar: &Tessera, extra: &[&str]) -> Tessera {
        let side = format!("m={}", sidecar.base());
        let mut args = vec!["--sidecar", side.as_str()];
        args.extend_from_slice(extra);
        Tessera::activator_for(&format!("m={}", emu.base()), &args)
    }

    /// This activator's stats document (`/tessera/v1/stats` on its admin listener).
    pub async fn activator_stats(&self) -> serde_json::Value {
        get_json(
            &http_client(Duration::from_secs(60)),
            &self.admin_url("/tessera/v1/stats"),
        )
        .await
    }

    /// Polls this activator's stats until `pred` holds, failing the test after `within` with `what` and the last
    /// document.
    pub async fn wait_activator_stats(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + within;
        loop {
            let s = self.activator_stats().await;
            if pred(&s) {
                return s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "stats never showed {what}: {s}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// `tessera autoscaler` as `identity`, against the API in `kubeconfig`, deciding every second and reading the
/// activators every 300 ms, with its metrics on `metrics_port`; killed on drop.
pub fn start_autoscaler(
    identity: &str,
    kubeconfig: &std::path::Path,
    metrics_port: u16,
    extra: &[&str],
) -> Killed {
    let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "autoscaler",
            "--sync-period",
            "1s",
            "--activator-poll-interval",
            "300ms",
            "--retry-period",
            "500ms",
        ])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
        .args(["--lease-namespace", "default", "--identity", identity])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,kube=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start tessera autoscaler");
    Killed(child)
}

/// The kubelet's downward-API file for `pod` (a pod object as JSON): every annotation, Go-quoted (`key="value"` per
/// line), written whole (a rename), as a sidecar's `--rest-file` reads it.
pub fn write_annotations(file: &std::path::Path, pod: &serde_json::Value) {
    let mut text = String::new();
    if let Some(a) = pod["metadata"]["annotations"].as_object() {
        for (k, v) in a {
            let value = serde_json::to_string(v.as_str().unwrap_or_default()).expect("a string encodes");
            text.push_str(&format!("{k}={value}\n"));
        }
    }
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write the annotations file");
    std::fs::rename(tmp, file).expect("rename the annotations file");
}
