//! The GPU workloads page in a real browser: real emulators and sidecars under load, `tessera autoscaler --no-kube
//! --sidecar ...` serving `/ui`, and headless Chromium loading it. Asserts on the DOM Chromium built (model rows,
//! numbers, the sort script having run) and on its console (no errors), and saves a screenshot under
//! `target/tmp/ui-browser/` for people to look at.
//!
//! Needs Debian's `chromium` (`scripts/test.sh` installs it when missing), or set `TESSERA_CHROMIUM` to a
//! Chromium binary. `TESSERA_SKIP_BROWSER_TEST=1` skips this test with a message (documented in the README);
//! without it a missing browser fails the test.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::Tessera;

/// Chromium, or `None` when the test is opted out.
fn chromium() -> Option<PathBuf> {
    if std::env::var_os("TESSERA_SKIP_BROWSER_TEST").is_some() {
        eprintln!("skipping the browser test: TESSERA_SKIP_BROWSER_TEST is set");
        return None;
    }
    if let Some(p) = std::env::var_os("TESSERA_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            && out.status.success()
        {
            return Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
    }
    panic!(
        "no Chromium found: install Debian's chromium (scripts/test.sh does), set TESSERA_CHROMIUM, or set \
         TESSERA_SKIP_BROWSER_TEST=1 to skip this test"
    );
}

/// Runs headless Chromium on `url` with a fresh profile and no network beyond loopback; returns stdout and the
/// console lines it logged.
fn headless(browser: &Path, profile: &Path, extra: &[&str], url: &str) -> (String, Vec<String>) {
    let out = Command::new("timeout")
        .arg("90")
        .arg(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect();
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}

/// One replica: an emulated vLLM and its sidecar, sized like the preset's real model.
fn replica(preset: &str, served: &str, bytes_per_kv_token: &str) -> (Tessera, Tessera) {
    let vllm = Tessera::vllm_sim(&["--model-preset", preset, "--served-model-name", served]);
    let sidecar = Tessera::sidecar(
        &vllm.base(),
        &[
            "--scrape-interval",
            "300ms",
            "--min-window",
            "2s",
            "--min-samples",
            "3",
            "--gpu-memory-mib",
            "81920",
            "--bytes-per-kv-token",
            bytes_per_kv_token,
            "--max-step-down",
            "0.9",
            "--ttft-slo",
            "2s",
            "--itl-slo",
            "200ms",
        ],
    );
    (vllm, sidecar)
}

async fn load(client: &reqwest::Client, vllm: &Tessera, model: &str, requests: usize) {
    let prompt = "tell me about GPUs ".repeat(40);
    let body = serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 60});
    let sends = (0..requests).map(|_| client.post(vllm.url("/v1/completions")).json(&body).send());
    for r in futures::future::join_all(sends).await {
        let r = r.expect("a completion");
        assert!(r.status().is_success(), "the emulator answered {}", r.status());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
async fn the_page_in_headless_chromium_shows_models_recommendations_and_savings() {
    let Some(browser) = chromium() else { return };
    let work = tempfile::tempdir().expect("tempdir");

    // The console check must be able to fail: a page that logs an error is caught.
    let (_, console) = headless(
        &browser,
        &work.path().join("probe"),
        &["--dump-dom"],
        "data:text/html,<script>console.error('probe')</script>",
    );
    assert!(
        console.iter().any(|l| l.contains("probe")),
        "console lines are not captured: {console:?}"
    );

    // chat: two replicas of a 7B model; embed: one small model. Every replica holds a whole GPU today.
    let chat = [
        replica("qwen2-7b", "chat", "57344"),
        replica("qwen2-7b", "chat", "57344"),
    ];
    let embed = replica("opt-125m", "embed", "36864");
    let mut args = vec![
        "autoscaler".to_owned(),
        "--no-kube".to_owned(),
        "--metrics-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--sync-period".to_owned(),
        "300ms".to_owned(),
    ];
    for (name, (_, sidecar)) in [("chat", &chat[0]), ("chat", &chat[1]), ("embed", &embed)] {
        args.push("--sidecar".to_owned());
        args.push(format!("{name}={}", sidecar.base()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ui = Tessera::start(&args);

    // Some load, then wait until every model has a recommendation on the page.
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let page = loop {
        tokio::join!(
            load(&client, &chat[0].0, "chat", 8),
            load(&client, &chat[1].0, "chat", 4),
            load(&client, &embed.0, "embed", 2),
        );
        let page = support::get_text(&client, &ui.url("/ui")).await;
        // Every model with a recommendation, and prefill/decode quantiles from a window with requests in it.
        if page.contains(r#"data-model="local/chat""#)
            && !page.contains("not yet")
            && page.contains("TTFT")
            && !page.contains(r#"<td class="phases" data-v="-1e300""#)
        {
            break page;
        }
        assert!(
            Instant::now() < deadline,
            "no recommendation for every model within 60 s:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(page.contains("<svg"), "charts are inline SVG");

    // The DOM after scripts ran, sorted by the "Replicas" column (column 4) descending through the page's #sort=
    // hook.
    let (dom, console) = headless(
        &browser,
        &work.path().join("profile"),
        &["--dump-dom", "--virtual-time-budget=2000"],
        &ui.url("/ui#sort=-4"),
    );
    assert!(console.is_empty(), "the page logged to the console: {console:#?}");
    let chat_row = dom.find(r#"data-model="local/chat""#).expect("a row for chat");
    let embed_row = dom.find(r#"data-model="local/embed""#).expect("a row for embed");
    assert!(
        chat_row < embed_row,
        "sorted by replicas, descending: chat (2) before embed (1)"
    );
    assert!(dom.contains(r#"class="sorted-desc""#), "the sort script ran");
    let number = |id: &str| -> u64 {
        let at = dom
            .find(&format!(r#"id="{id}">"#))
            .unwrap_or_else(|| panic!("#{id} on the page"));
        let rest = &dom[at + id.len() + 6..];
        rest.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or_else(|_| panic!("#{id} holds a number: {}", &rest[..rest.len().min(40)]))
    };
    // Each model row: a workload class, a prefix-cache hit rate, prefill and decode quantiles.
    for model in ["chat", "embed"] {
        let at = dom
            .find(&format!(r#"data-model="local/{model}""#))
            .expect("the row");
        let row = &dom[at..at + dom[at..].find("</tr>").expect("the row ends")];
        let cell = |class: &str| -> &str {
            let start = row
                .find(&format!(r#"<td class="{class}""#))
                .unwrap_or_else(|| panic!("{model}: no {class} cell in {row}"));
            let body = &row[start..];
            &body[body.find('>').expect("a tag") + 1..body.find("</td>").expect("the cell ends")]
        };
        let class = cell("l class");
        assert!(
            ["realtime", "nearRealtime", "batch"]
                .iter()
                .any(|c| class.contains(&format!(r#"class="cls cls-{c}">{c}<"#))),
            "{model}: the class is one of the three: {class}"
        );
        let prefix = cell("prefix");
        let percent: f64 = prefix
            .strip_suffix('%')
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{model}: the prefix-cache hit rate is a percentage: {prefix}"));
        assert!((0.0..=100.0).contains(&percent), "{model}: {prefix}");
        let phases = cell("phases");
        assert!(
            !phases.starts_with('—') && phases.contains(" · ") && phases.contains("p50"),
            "{model}: prefill and decode p95 and p50 are shown: {phases}"
        );
    }
    // Local mode declares nothing and keeps no history, and a 2 s TTFT objective is one people wait on:
    // real-time, with the policy that class chose under it.
    assert!(
        dom.contains(r#"class="cls cls-realtime">realtime<"#) && dom.contains("warm replica kept"),
        "with a 2 s TTFT objective and nothing declared a model is real-time"
    );
    assert_eq!(number("gpus-held"), 3, "three replicas, one whole GPU each");
    let needed = number("gpus-needed");
    assert!((1..=3).contains(&needed), "needed {needed}");
    assert_eq!(number("gpus-freed"), 3 - needed);
    assert!(dom.contains(r#"id="monthly-savings">$"#), "savings in money");
    assert!(
        dom.contains("history since"),
        "the page says where its history starts"
    );
    assert!(
        dom.contains("local mode"),
        "the page says it is the read-only local mode"
    );
    assert!(
        dom.contains("No fractional pools"),
        "no shared GPUs in local mode"
    );

    // At 1,400 px (a laptop) the models table fits: no sideways scroll (it needed about 1,900 px for one model).
    let (laid_out, _) = headless(
        &browser,
        &work.path().join("profile-layout"),
        &[
            "--window-size=1400,900",
            "--dump-dom",
            "--virtual-time-budget=2000",
        ],
        &ui.url("/ui#layout"),
    );
    let overflow = laid_out
        .split_once(r#"data-models-overflow=""#)
        .and_then(|(_, rest)| rest.split('"').next())
        .and_then(|v| v.parse::<u32>().ok())
        .expect("the #layout hook ran");
    assert_eq!(
        overflow, 0,
        "the models table scrolls sideways by {overflow} px at 1,400 px"
    );

    // The screenshot, for people.
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-browser");
    std::fs::create_dir_all(&shots).expect("create the screenshot folder");
    let png = shots.join("ui.png");
    let _ = std::fs::remove_file(&png);
    headless(
        &browser,
        &work.path().join("profile-shot"),
        &[
            "--window-size=1400,1000",
            "--virtual-time-budget=2000",
            &format!("--screenshot={}", png.display()),
        ],
        &ui.url("/ui"),
    );
    let bytes = std::fs::read(&png).expect("the screenshot was written");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "a real PNG"
    );
    eprintln!("screenshot: {}", png.display());
}
