//! What a hostile or broken tenant pod can do to the control plane, over loopback against the real binary
//! (issue: "no tenant can stop the control plane"). Each test names what the pod does and what Tessera must do.

mod support;

use std::time::Duration;

use support::{Tessera, http_client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A "sidecar" that answers every request with `total` bytes of JSON-looking padding, as fast as loopback
/// allows; with `declare`, a Content-Length says so up front, otherwise the body runs until the connection closes.
async fn flooding_pod(total: usize, declare: bool) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = if declare {
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {total}\r\n\r\n"
                    )
                } else {
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"
                        .to_owned()
                };
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = [b' '; 256 * 1024];
                let mut left = total;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return; // the reader hung up: what a bounded reader does
                    }
                    left -= n;
                }
            });
        }
    });
    addr
}

/// The peak resident memory of a process (`VmHWM`), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/pid/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmHWM in /proc/pid/status")
        / 1024
}

/// Waits until the autoscaler's /metrics shows `want`, returning the page.
async fn wait_metric(ctl: &Tessera, want: &str, within: Duration) -> String {
    let client = http_client(Duration::from_secs(5));
    let deadline = std::time::Instant::now() + within;
    loop {
        let page = client
            .get(ctl.url("/metrics"))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics body");
        if page.contains(want) {
            return page;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "metrics never showed {want}:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A tenant pod answers its `/v1/status` with 300 MB (the reported attack took the autoscaler to 619 MB, over the
/// chart's 512Mi limit, and both replicas crash-looped). The autoscaler must refuse the document at its bound,
/// count the refusal, and stay small; the model reads as having no data (which never scales it down).
#[tokio::test]
async fn a_pod_answering_300_mb_cannot_run_the_autoscaler_out_of_memory() {
    const BIG: usize = 300 * 1024 * 1024;
    let declared = flooding_pod(BIG, true).await;
    let streamed = flooding_pod(BIG, false).await;
    let ctl = Tessera::start(&[
        "autoscaler",
        "--no-kube",
        "--sidecar",
        &format!("declared=http://{declared}"),
        "--sidecar",
        &format!("streamed=http://{streamed}"),
        "--metrics-listen",
        "127.0.0.1:0",
        "--sync-period",
        "200ms",
        // Long enough to read 300 MB over loopback many times over: only the size bound can stop it.
        "--scrape-timeout",
        "20s",
    ]);
    let page = wait_metric(
        &ctl,
        r#"tessera_autoscaler_scrape_failures_total{source="sidecar",reason="too_large"} 4"#,
        Duration::from_secs(60),
    )
    .await;
    assert!(page.contains("too_large"), "{page}");
    let peak = peak_rss_mib(ctl.child.id());
    // Two reads at a time, each bounded at 8 MiB: far under 100 MiB whatever the pods send.
    assert!(
        peak < 100,
        "the autoscaler's peak RSS reached {peak} MiB reading 300 MB documents"
    );
}
