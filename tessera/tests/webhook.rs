//! `tessera webhook --no-kube` as a real process over real TLS on 127.0.0.1: AdmissionReview JSON in, allowed
//! with a patch / denied with a message / malformed bodies answered (never a crash); probes and metrics; and
//! certificate rotation (replace the files: the next connection gets the new certificate while an open one
//! keeps working). Certificates are made in the test with `rcgen`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod support;
use support::admission::{connect, connector, exchange, pair, peer, real_pod, review, start_webhook};

/// Replaces a file the way a kubelet secret update does: write beside it, then rename over it.
fn replace(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn admission_over_tls_and_certificate_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let first = pair();
    let metrics_port = support::free_port();
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let hook = start_webhook(
        dir.path(),
        &first,
        &metrics_listen,
        &[
            "--tls-reload-interval",
            "100ms",
            "--sidecar-image",
            "ghcr.io/tessera-dev/tessera:test",
        ],
    );
    let second = pair();
    let tls = connector(&[&first.der, &second.der]);
    let mut conn = connect(&tls, hook.addr).await;
    assert_eq!(peer(&conn), first.der);

    // Allowed with a patch that applies to the pod.
    let pod = real_pod();
    let (code, body) = exchange(&mut conn, "POST", "/mutate", &review("uid-allow", pod.clone())).await;
    assert_eq!(code, 200);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    let r = &answer["response"];
    assert_eq!(r["uid"], "uid-allow");
    assert_eq!(r["allowed"], true);
    assert_eq!(r["patchType"], "JSONPatch");
    // The patch travels as base64, the way the API server's Go types (`[]byte`) read it.
    let bytes = base64_decode(r["patch"].as_str().expect("the patch is a base64 string"));
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    assert_eq!(patched["spec"]["initContainers"][0]["name"], "tessera-sidecar");
    assert_eq!(
        patched["spec"]["initContainers"][0]["image"],
        "ghcr.io/tessera-dev/tessera:test"
    );

    // Denied with a message naming the field, the value and the fix.
    let mut bad = pod.clone();
    bad["metadata"]["annotations"] = json!({"tessera.dev/gpu-compute-fraction": "1.5"});
    let (code, body) = exchange(&mut conn, "POST", "/mutate", &review("uid-deny", bad)).await;
    assert_eq!(code, 200);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false);
    let msg = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("tessera.dev/gpu-compute-fraction=\"1.5\""),
        "{msg}"
    );
    assert!(msg.contains("such as \"0.25\""), "{msg}");

    // Malformed: not JSON → 400; JSON without a request → a well-formed review that refuses; a non-pod object →
    // admitted unchanged.
    let (code, body) = exchange(&mut conn, "POST", "/mutate", b"{not json").await;
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&body));
    let (code, body) = exchange(
        &mut conn,
        "POST",
        "/mutate",
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
    )
    .await;
    assert_eq!(code, 200);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false);
    let (code, body) = exchange(&mut conn, "POST", "/mutate", &review("uid-odd", json!([1, 2]))).await;
    assert_eq!(code, 200);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none());
    for path in ["/live", "/ready"] {
        assert_eq!(exchange(&mut conn, "GET", path, b"").await.0, 200, "{path}");
    }

    // Metrics on the plain-HTTP port.
    let page = support::get_text(
        &reqwest::Client::new(),
        &format!("http://{metrics_listen}/metrics"),
    )
    .await;
    assert!(
        page.contains(r#"tessera_webhook_admissions_total{outcome="mutated",reason="whole"} 1"#),
        "{page}"
    );
    assert!(
        page.contains(r#"tessera_webhook_admissions_total{outcome="denied",reason="invalid_setting"} 1"#)
    );
    assert!(page.contains(r#"tessera_webhook_admissions_total{outcome="unchanged",reason="not_a_pod"} 1"#));
    assert!(page.contains("tessera_webhook_admission_duration_seconds_bucket"));

    // Rotation: replace both files; the next connection sees the new certificate, the open one keeps working.
    replace(&key_path, &second.key_pem);
    replace(&cert_path, &second.cert_pem);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fresh = connect(&tls, hook.addr).await;
        if peer(&fresh) == second.der {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was not served within 10s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(peer(&conn), first.der, "the open connection keeps its handshake");
    let (code, _) = exchange(&mut conn, "POST", "/mutate", &review("uid-after", pod)).await;
    assert_eq!(code, 200, "an open connection survives the rotation");
    let page = support::get_text(
        &reqwest::Client::new(),
        &format!("http://{metrics_listen}/metrics"),
    )
    .await;
    assert!(
        page.contains(r#"tessera_webhook_tls_reloads_total{result="ok"}"#),
        "{page}"
    );
    drop(hook);
}

/// Standard base64 (RFC 4648, padded), decoded independently of the webhook's encoder.
fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    assert_eq!(s.len() % 4, 0, "padded base64");
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let mut v = 0u32;
        let mut pad = 0;
        for &c in chunk {
            v <<= 6;
            if c == b'=' {
                pad += 1;
            } else {
                v |= ALPHABET.iter().position(|&a| a == c).expect("a base64 character") as u32;
            }
        }
        out.extend_from_slice(&v.to_be_bytes()[1..4 - pad]);
    }
    out
}
