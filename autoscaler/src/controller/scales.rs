//! The replica count and pod selector of every Deployment a round scales, from one watch instead of one
//! `GET /scale` per model per round.
//!
//! With the pods read from a reflector (`super::pods`), the `GET /scale` of each reconcile was the last read a
//! round made: at 1,000 models and a 2 s sync, 500 requests a second queued in the API server beside the writes.
//! A Deployment's `/scale` is computed from the Deployment itself (`spec.replicas`, and `spec.selector` in the
//! string form `metav1.FormatLabelSelector` writes), so a watch of Deployments answers it. Each object is stored
//! without its managed fields and pod template, which nothing here reads and which are most of its bytes.
//!
//! The cache answers only once its first list is in, and only for a Deployment it holds; anything else
//! (StatefulSets, other kinds, a watch that RBAC refuses) is read through `/scale` as before. After this
//! controller's own `/scale` write the cached Deployment is stale until the watch brings the write; until its
//! resourceVersion moves, that target is read through `/scale` too, so a round never decides from the count
//! before its own last write (which would write the same scale, its Event and its `lastScaleTime` twice).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use crate::kube_client::Cached;

/// Every Deployment the controller may scale; answers nothing until the first list arrived.
#[derive(Debug, Clone, Default)]
pub struct DeploymentCache {
    cache: Cached<Deployment>,
    /// By `namespace/name`: the resourceVersion the cache held when this controller wrote the Deployment's
    /// `/scale`, until the watch brings a newer one: until then the cache does not answer for it (a round would
    /// read the count from before the write and make the same write again). At most one entry per Deployment in
    /// the cache: an entry goes when its Deployment answers again or is gone.
    written: Arc<Mutex<HashMap<String, String>>>,
}

impl DeploymentCache {
    /// Starts watching `api` until `stop`.
    pub fn start(api: Api<Deployment>, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        let cache = Cached::start(
            api,
            "Deployments",
            |d: &mut Deployment| {
                d.metadata.managed_fields = None;
                d.metadata.annotations = None;
                if let Some(spec) = d.spec.as_mut() {
                    spec.template = Default::default();
                }
            },
            stop,
        );
        Self {
            cache,
            ..Self::default()
        }
    }

    /// What `GET /scale` of `namespace/name` would answer: `spec.replicas` and the selector string; `None` when
    /// the cache cannot say (no list yet, no such Deployment in it, or this controller's last write to it not
    /// seen yet).
    pub fn scale(&self, namespace: &str, name: &str) -> Option<(u32, String)> {
        let store = self.cache.store()?;
        let key = format!("{namespace}/{name}");
        let mut written = self.written.lock().ok()?;
        let Some(d) = store.get(&ObjectRef::new(name).within(namespace)) else {
            written.remove(&key);
            return None;
        };
        if written.get(&key) == d.metadata.resource_version.as_ref() {
            return None;
        }
        written.remove(&key);
        drop(written);
        let spec = d.spec.as_ref()?;
        // Read as `/scale` is read (`reconcile::read_scale`): the API server defaults spec.replicas to 1, so a
        // Deployment read back has it; an absent one reads 0 there too.
        let replicas = spec.replicas.and_then(|r| u32::try_from(r).ok()).unwrap_or(0);
        Some((replicas, format_selector(&spec.selector)))
    }

    /// This controller wrote `replicas` to `namespace/name`'s `/scale`: unless the cache shows that count already
    /// (the watch was quicker), the Deployment it holds is stale until the watch brings the write or anything
    /// newer.
    pub fn wrote(&self, namespace: &str, name: &str, replicas: u32) {
        let Some(store) = self.cache.store() else { return };
        let Some(d) = store.get(&ObjectRef::new(name).within(namespace)) else {
            return;
        };
        let shown = d
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .and_then(|r| u32::try_from(r).ok());
        if shown == Some(replicas) {
            return;
        }
        if let (Some(rv), Ok(mut w)) = (d.metadata.resource_version.clone(), self.written.lock()) {
            w.insert(format!("{namespace}/{name}"), rv);
        }
    }
}

/// A label selector in the string form `/scale`'s `status.selector` carries (`metav1.FormatLabelSelector`:
/// requirements sorted by key, `k=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, joined by commas).
pub fn format_selector(s: &LabelSelector) -> String {
    let mut parts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in s.match_labels.iter().flatten() {
        parts.entry(k.clone()).or_default().push(format!("{k}={v}"));
    }
    for e in s.match_expressions.iter().flatten() {
        let mut values = e.values.clone().unwrap_or_default();
        values.sort();
        let r = match e.operator.as_str() {
            "In" => format!("{} in ({})", e.key, values.join(",")),
            "NotIn" => format!("{} notin ({})", e.key, values.join(",")),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            // An operator the API server would have refused: a requirement nothing matches is safer than none.
            other => format!("{} in (__unknown_operator_{other})", e.key),
        };
        parts.entry(e.key.clone()).or_default().push(r);
    }
    parts.into_values().flatten().collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::pods::parse_selector;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use kube::runtime::watcher;

    fn deployment(rv: &str, replicas: i32) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "llama", "namespace": "models", "resourceVersion": rv},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "llama"}},
                     "template": {"metadata": {"labels": {"app": "llama"}}}}
        }))
        .expect("a Deployment")
    }

    /// After its own write the controller does not read the count from before it: the cache stands aside until
    /// the watch brings the write, and answers again from then on.
    #[test]
    fn the_cache_never_answers_with_the_count_from_before_its_own_write() {
        let (reader, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&watcher::Event::Apply(deployment("10", 2)));
        let c = DeploymentCache {
            cache: Cached::of(reader),
            ..DeploymentCache::default()
        };
        assert_eq!(c.scale("models", "llama"), Some((2, "app=llama".to_owned())));
        assert_eq!(
            c.scale("models", "other"),
            None,
            "not in the cache: read through /scale"
        );
        c.wrote("models", "llama", 4);
        assert_eq!(
            c.scale("models", "llama"),
            None,
            "2 is from before the write of 4"
        );
        writer.apply_watcher_event(&watcher::Event::Apply(deployment("11", 4)));
        assert_eq!(c.scale("models", "llama"), Some((4, "app=llama".to_owned())));
        // A watch quicker than the write's answer: nothing to stand aside for.
        c.wrote("models", "llama", 4);
        assert_eq!(c.scale("models", "llama"), Some((4, "app=llama".to_owned())));
    }

    #[test]
    fn a_deployments_selector_reads_as_its_scale_subresource_writes_it() {
        let s = LabelSelector {
            match_labels: Some(BTreeMap::from([
                ("app".to_owned(), "llama".to_owned()),
                ("team".to_owned(), "ml".to_owned()),
            ])),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["b".into(), "a".into()]),
                },
                LabelSelectorRequirement {
                    key: "canary".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
            ]),
        };
        // As kube-apiserver writes it for this selector (sorted by key).
        assert_eq!(format_selector(&s), "app=llama,!canary,team=ml,tier in (a,b)");
        assert_eq!(parse_selector(&format_selector(&s)).map(|r| r.len()), Some(4));
        assert_eq!(format_selector(&LabelSelector::default()), "");
    }
}
