//! Tests on real vLLM pages (`testdata/vllm/`, provenance in its SOURCES.md) and hand-built V1 pages.
#![allow(clippy::unwrap_used)]

use super::*;

const DATADOG_043: &str = include_str!("../../../testdata/vllm/v0-metrics-datadog-vllm-0.4.3-opt125m.txt");
const KUBEAI: &str = include_str!("../../../testdata/vllm/v0-metrics-kubeai-llama31-8b-fp8.txt");
const MIXED: &str = include_str!("../../../testdata/vllm/mixed-v0v1-metrics-datadog-edited-fixture.txt");

#[test]
fn real_pages_parse_without_line_errors() {
    for (name, page) in [("datadog", DATADOG_043), ("kubeai", KUBEAI), ("mixed", MIXED)] {
        let p = parse_text(page);
        assert!(p.errors.is_empty(), "{name}: {:?}", p.errors);
        assert!(VllmSnapshot::from_text(page).is_ok(), "{name}");
    }
}
