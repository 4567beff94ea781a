//! The pods every reconcile reads, from one watch instead of one `LIST` per model per round.
//!
//! At 1,000 models and a 5 s sync the per-round `LIST pods` was a third of the API requests Tessera made and,
//! being a consistent read, the heaviest (docs/performance.md, "Fleet"): each round's list waited in the API
//! server's queue behind the others, which is what put the reaction's tail past the sync period. A reflector over
//! the watched scope answers from memory; its managed fields are dropped before they are stored (they are most of
//! a pod's bytes and nothing here reads them).
//!
//! The cache answers only once its first list is in and only for a selector it can read (`matching` returns
//! `None` otherwise, and the caller lists as before): a cache that cannot answer never stands in for one that is
//! empty. Its pods may be a watch event behind the API server; a pod deleted a moment ago still reads as there,
//! its sidecar unreachable, which counts as missing data (never a scale-down).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use crate::kube_client::Cached;

/// Every pod the controller may see; `None` until the first list arrived or where no watch runs.
#[derive(Debug, Clone, Default)]
pub struct PodCache(Cached<Pod>);

impl PodCache {
    /// Starts watching `api` until `stop`; the cache answers once the first list is in.
    pub fn start(api: Api<Pod>, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        Self(Cached::start(
            api,
            "pods",
            |p: &mut Pod| p.metadata.managed_fields = None,
            stop,
        ))
    }

    /// The pods of `namespace` that `selector` (a `/scale` status selector) selects; `None` while the cache has
    /// no list or the selector is not one [`parse_selector`] reads.
    pub fn matching(&self, namespace: &str, selector: &str) -> Option<Vec<Pod>> {
        let requirements = parse_selector(selector)?;
        let store = self.0.store()?;
        let empty = BTreeMap::new();
        Some(
            store
                .state()
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
                .filter(|p| {
                    let labels = p.metadata.labels.as_ref().unwrap_or(&empty);
                    requirements.iter().all(|r| r.matches(labels))
                })
                .map(|p| p.as_ref().clone())
                .collect(),
        )
    }
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` or `key==value`.
    Equal(String, String),
    /// `key!=value`.
    NotEqual(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)`.
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Equal(k, v) => labels.get(k) == Some(v),
            Self::NotEqual(k, v) => labels.get(k) != Some(v),
            Self::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Self::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Self::Exists(k) => labels.contains_key(k),
            Self::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A label selector in the API's string form (what `/scale`'s `status.selector` carries:
/// `metav1.FormatLabelSelector`), as requirements; `None` for an empty selector (it would select every pod, and
/// no workload's pods are all of a namespace's) or one this does not read.
pub fn parse_selector(s: &str) -> Option<Vec<Requirement>> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        // A requirement ends at the first comma outside parentheses.
        let mut depth = 0i32;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                c == ',' && depth == 0
            })
            .map_or(rest.len(), |(i, _)| i);
        out.push(requirement(rest[..end].trim())?);
        rest = rest.get(end + 1..).unwrap_or("");
    }
    Some(out)
}

fn requirement(r: &str) -> Option<Requirement> {
    let set = |rest: &str| -> Option<Vec<String>> {
        let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
        Some(
            inner
                .split(',')
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect(),
        )
    };
    if let Some((k, v)) = r.split_once("!=") {
        return Some(Requirement::NotEqual(key(k)?, v.trim().to_owned()));
    }
    if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
        return Some(Requirement::Equal(key(k)?, v.trim().to_owned()));
    }
    if let Some((k, rest)) = r.split_once(" notin ") {
        return Some(Requirement::NotIn(key(k)?, set(rest)?));
    }
    if let Some((k, rest)) = r.split_once(" in ") {
        return Some(Requirement::In(key(k)?, set(rest)?));
    }
    if let Some(k) = r.strip_prefix('!') {
        return Some(Requirement::DoesNotExist(key(k)?));
    }
    Some(Requirement::Exists(key(r)?))
}

fn key(k: &str) -> Option<String> {
    let k = k.trim();
    let ok = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    ok.then(|| k.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn selectors_as_scale_status_writes_them_select_what_the_api_server_would() {
        let r = parse_selector("app=llama,tier in (a, b),!canary,team,env!=dev").expect("parsed");
        assert_eq!(r.len(), 5);
        let m = |l: &BTreeMap<String, String>| r.iter().all(|q| q.matches(l));
        assert!(m(&labels(&[("app", "llama"), ("tier", "b"), ("team", "x")])));
        assert!(
            !m(&labels(&[("app", "llama"), ("tier", "c"), ("team", "x")])),
            "tier not in the set"
        );
        assert!(!m(&labels(&[
            ("app", "llama"),
            ("tier", "a"),
            ("team", "x"),
            ("canary", "1")
        ])));
        assert!(!m(&labels(&[("app", "llama"), ("tier", "a")])), "team must exist");
        assert!(!m(&labels(&[
            ("app", "llama"),
            ("tier", "a"),
            ("team", "x"),
            ("env", "dev")
        ])));
        let notin = parse_selector("app.kubernetes.io/name==vllm,zone notin (z1)").expect("parsed");
        assert!(
            notin
                .iter()
                .all(|q| q.matches(&labels(&[("app.kubernetes.io/name", "vllm")])))
        );
        assert_eq!(
            parse_selector(""),
            None,
            "an empty selector would select every pod"
        );
        assert_eq!(
            parse_selector("app in (a"),
            None,
            "unreadable: the caller lists instead"
        );
        assert_eq!(parse_selector("a b=c"), None);
    }
}
