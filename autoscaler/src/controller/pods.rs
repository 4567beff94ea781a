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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use crate::kube_client::Cached;

/// Every pod the controller may see; `None` until the first list arrived or where no watch runs.
#[derive(Debug, Clone, Default)]
pub struct PodCache {
    cache: Cached<Pod>,
    /// The cached pods by namespace, rebuilt when the watch has taken an event since: each model's round reads its
    /// own namespace's pods, not every pod of the fleet (at 1,000 models the scan of all namespaces was 5% of the
    /// controller's CPU, docs/performance.md "Fleet").
    by_namespace: Arc<Mutex<ByNamespace>>,
}

#[derive(Debug, Default)]
struct ByNamespace {
    /// The watch's event count the index was built at; `None`: never built, or the store's events are not counted.
    changes: Option<u64>,
    pods: HashMap<String, Vec<Arc<Pod>>>,
}

impl PodCache {
    /// Starts watching `api` until `stop`; the cache answers once the first list is in.
    pub fn start(api: Api<Pod>, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        Self::over(Cached::start(
            api,
            "pods",
            |p: &mut Pod| p.metadata.managed_fields = None,
            stop,
        ))
    }

    /// Over a cache someone else fills (a test's store).
    pub fn over(cache: Cached<Pod>) -> Self {
        Self {
            cache,
            by_namespace: Arc::default(),
        }
    }

    /// The pods of `namespace` that `selector` (a `/scale` status selector) selects; `None` while the cache has
    /// no list or the selector is not one [`parse_selector`] reads.
    pub fn matching(&self, namespace: &str, selector: &str) -> Option<Vec<Pod>> {
        let requirements = parse_selector(selector)?;
        // The count before the state: an index built from a newer state than its count is only rebuilt once more.
        let changes = self.cache.changes();
        let store = self.cache.store()?;
        // A round that panicked while rebuilding left a whole index or none: either is safe to rebuild from.
        let mut index = self.by_namespace.lock().unwrap_or_else(PoisonError::into_inner);
        if changes.is_none() || index.changes != changes {
            let mut pods: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
            for p in store.state() {
                if let Some(ns) = p.metadata.namespace.clone() {
                    pods.entry(ns).or_default().push(p);
                }
            }
            *index = ByNamespace { changes, pods };
        }
        let empty = BTreeMap::new();
        Some(
            index
                .pods
                .get(namespace)
                .into_iter()
                .flatten()
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

    fn pod(ns: &str, name: &str, app: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}
        }))
        .expect("a Pod")
    }

    fn names(pods: Option<Vec<Pod>>) -> Vec<String> {
        let mut n: Vec<_> = pods
            .expect("the cache answers")
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        n.sort();
        n
    }

    /// A model's round reads its own namespace's pods only, and the index follows the watch: kept while no event
    /// came, rebuilt after one (an apply or a delete).
    #[test]
    fn the_namespace_index_answers_per_namespace_and_follows_the_watch() {
        use kube::runtime::watcher::Event;
        let (reader, mut writer) = kube::runtime::reflector::store();
        let changes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let event = |w: &mut kube::runtime::reflector::store::Writer<Pod>, e: Event<Pod>| {
            w.apply_watcher_event(&e);
            changes.fetch_add(1, std::sync::atomic::Ordering::Release);
        };
        event(&mut writer, Event::Apply(pod("a", "llama-1", "llama")));
        event(&mut writer, Event::Apply(pod("b", "llama-1", "llama")));
        event(&mut writer, Event::Apply(pod("a", "qwen-1", "qwen")));
        let cache = PodCache::over(Cached::of_counted(reader, changes.clone()));
        assert_eq!(names(cache.matching("a", "app=llama")), ["llama-1"]);
        assert_eq!(names(cache.matching("b", "app=llama")), ["llama-1"]);
        assert_eq!(names(cache.matching("c", "app=llama")), Vec::<String>::new());

        // A pod the store holds but whose event was not counted yet is not read from the kept index...
        writer.apply_watcher_event(&Event::Apply(pod("a", "llama-2", "llama")));
        assert_eq!(names(cache.matching("a", "app=llama")), ["llama-1"]);
        // ...and is once the count moves; a delete is seen the same way.
        changes.fetch_add(1, std::sync::atomic::Ordering::Release);
        assert_eq!(names(cache.matching("a", "app=llama")), ["llama-1", "llama-2"]);
        event(&mut writer, Event::Delete(pod("a", "llama-1", "llama")));
        assert_eq!(names(cache.matching("a", "app=llama")), ["llama-2"]);

        // A store whose events nobody counts is read afresh each time.
        let (reader, mut writer) = kube::runtime::reflector::store();
        let uncounted = PodCache::over(Cached::of(reader));
        writer.apply_watcher_event(&Event::Apply(pod("a", "llama-1", "llama")));
        assert_eq!(names(uncounted.matching("a", "app=llama")), ["llama-1"]);
        writer.apply_watcher_event(&Event::Delete(pod("a", "llama-1", "llama")));
        assert_eq!(names(uncounted.matching("a", "app=llama")), Vec::<String>::new());
        assert_eq!(
            PodCache::default().matching("a", "app=llama"),
            None,
            "no list yet"
        );
    }
}
