//! Which vLLM set-ups sleep mode is risky on: vLLM has returned wrong answers after a wake with LoRA adapters and
//! at level 2, and sleep under tensor parallel or with hybrid / sliding-window attention models keeps several GiB
//! per GPU or has had fixes of its own across releases. The webhook reads the server's command line and image
//! ([`from_command`]) and hands the list to the sidecar, which reports it (`rest.risks`); the controller then does
//! not put the model to sleep unless `spec.sleep.allowRisky` (`core::sleep::rule`). The sidecar checks every wake
//! with a canary answer either way.

/// The vLLM releases whose sleep API the sidecar is written against (`/sleep?level=`, `/wake_up?tags=`,
/// `/is_sleeping`, `collective_rpc` for level 2's reload): from 0.8.0 (sleep mode appeared in 0.7.3) up to, not
/// including, 0.12. From vLLM's documentation, not from runs on a GPU here.
pub const TESTED_FROM: (u32, u32) = (0, 8);
/// First release past the range.
pub const TESTED_BEFORE: (u32, u32) = (0, 12);

/// The risks of the server started with `words` (its command and arguments) from `image`, each a sentence.
pub fn from_command(words: &[String], image: Option<&str>) -> Vec<String> {
    let mut risks = Vec::new();
    let value = |flags: &[&str]| -> Option<String> {
        words.iter().enumerate().find_map(|(i, w)| {
            let w = w.trim_matches(|c| c == '"' || c == '\'');
            match w.split_once('=') {
                Some((f, v)) if flags.contains(&f) => Some(v.to_owned()),
                None if flags.contains(&w) => words.get(i + 1).cloned().or_else(|| Some(String::new())),
                _ => None,
            }
        })
    };
    if value(&["--enable-lora", "--enable_lora"]).is_some_and(|v| !v.eq_ignore_ascii_case("false")) {
        risks.push(
            "LoRA adapters (--enable-lora): vLLM has answered wrongly after a wake with adapters".to_owned(),
        );
    }
    if let Some(tp) = value(&["--tensor-parallel-size", "--tensor_parallel_size", "-tp"])
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|&n| n > 1)
    {
        risks.push(format!(
            "tensor parallel ({tp} GPUs): a sleeper keeps several GiB on every GPU"
        ));
    }
    if let Some(tag) = image.and_then(|i| i.rsplit_once(':')).map(|(_, t)| t)
        && let Some((major, minor)) = version(tag)
        && !(TESTED_FROM..TESTED_BEFORE).contains(&(major, minor))
    {
        risks.push(format!(
            "vLLM {tag} is outside the range the sidecar's sleep calls are written for ({}.{} to before {}.{})",
            TESTED_FROM.0, TESTED_FROM.1, TESTED_BEFORE.0, TESTED_BEFORE.1
        ));
    }
    risks
}

/// `v0.11.0`, `0.11.0-cu128` → (0, 11); anything else (`latest`, a digest) → `None`.
fn version(tag: &str) -> Option<(u32, u32)> {
    let t = tag.strip_prefix('v').unwrap_or(tag);
    let mut parts = t.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// A hybrid or sliding-window model, from its `config.json` (the sidecar's `--model-dir`): a risk of its own.
pub fn from_model_config(config: &serde_json::Value) -> Option<String> {
    let swa = config.get("sliding_window").is_some_and(|v| !v.is_null())
        || config.get("layer_types").is_some_and(|v| v.is_array());
    swa.then(|| {
        "a hybrid or sliding-window attention model: its sleep and wake have had fixes of their own"
            .to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn names_each_risk_and_nothing_on_a_plain_server() {
        assert!(
            from_command(
                &w("vllm serve /m --enable-sleep-mode"),
                Some("vllm/vllm-openai:v0.11.0")
            )
            .is_empty()
        );
        let r = from_command(
            &w("vllm serve /m --enable-lora --tensor-parallel-size 2"),
            Some("vllm/vllm-openai:v0.11.0"),
        );
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(
            r[0].starts_with("LoRA") && r[1].starts_with("tensor parallel (2"),
            "{r:?}"
        );
        assert!(
            from_command(
                &w("vllm serve /m --tensor-parallel-size=1 --enable-lora=false"),
                None
            )
            .is_empty()
        );
        let old = from_command(&w("vllm serve /m"), Some("vllm/vllm-openai:v0.7.3"));
        assert!(old[0].contains("outside the range"), "{old:?}");
        assert!(!from_command(&w("vllm serve /m"), Some("vllm/vllm-openai:v0.12.1"))[0].is_empty());
        assert!(from_command(&w("vllm serve /m"), Some("vllm/vllm-openai:latest")).is_empty());
        assert!(from_model_config(&serde_json::json!({"sliding_window": 4096})).is_some());
        assert!(from_model_config(&serde_json::json!({"sliding_window": null})).is_none());
    }
}
