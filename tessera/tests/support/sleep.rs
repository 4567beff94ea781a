//! One model's replica in sleep mode for the controller's tests (a real emulator, a real sidecar reading its
//! downward-API file) and the kubelet and ReplicaSets those tests play on the in-memory API server.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::apiserver::{ApiServer, PODS};
use super::{Tessera, get_json, write_annotations};

/// One model's replica: its emulator, its sidecar and the annotations file the kubelet keeps for it.
pub struct Replica {
    /// The model (and Deployment) name; its pod is `<name>-0`.
    pub name: &'static str,
    /// Its downward-API annotations file.
    pub file: std::path::PathBuf,
    /// The emulator in sleep mode.
    pub emu: Tessera,
    /// The sidecar in front of it.
    pub sidecar: Tessera,
}

impl Replica {
    /// Starts the emulator and its sidecar, the annotations file in `dir`.
    pub fn start(dir: &Path, name: &'static str) -> Self {
        let file = dir.join(format!("{name}.annotations"));
        std::fs::write(&file, "").expect("create the annotations file");
        let emu = Tessera::sleepy_sim(&[]);
        let sidecar = Tessera::rest_sidecar(&emu, &file, &[]);
        Replica {
            name,
            file,
            emu,
            sidecar,
        }
    }

    /// The sidecar's port (the pod's `tessera.dev/sidecar-port`).
    pub fn port(&self) -> u16 {
        self.sidecar
            .base()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a sidecar's base URL ends with its port")
    }

    /// The sidecar's `rest` document.
    pub async fn rest(&self, c: &reqwest::Client) -> Value {
        get_json(c, &self.sidecar.url("/v1/status")).await["rest"].clone()
    }
}

/// The kubelet and the ReplicaSets of `replicas`: each `<name>-0` pod deleted once its Deployment wants none, its
/// annotations copied into its sidecar's file, its Ready condition set from its sidecar's `/ready`.
pub fn kubelet(api: &ApiServer, c: &reqwest::Client, replicas: &[&Replica]) -> tokio::task::JoinHandle<()> {
    let kube = api.clone();
    let kc = c.clone();
    let replicas: Vec<(&'static str, std::path::PathBuf, String)> = replicas
        .iter()
        .map(|r| (r.name, r.file.clone(), r.sidecar.url("/ready")))
        .collect();
    tokio::spawn(async move {
        let mut seen = vec![String::new(); replicas.len()];
        loop {
            for (i, (name, file, ready_url)) in replicas.iter().enumerate() {
                let pod_name = format!("{name}-0");
                if kube.wanted_replicas("default", name) == 0 {
                    kube.delete_object(PODS, "default", &pod_name);
                }
                let Some(mut p) = kube.get(PODS, "default", &pod_name) else {
                    continue;
                };
                let annotations = p["metadata"]["annotations"].to_string();
                if annotations != seen[i] {
                    write_annotations(file, &p);
                    seen[i] = annotations;
                }
                let ready = kc
                    .get(ready_url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                let now = if ready { "True" } else { "False" };
                if p["status"]["conditions"][0]["status"] != now {
                    p["status"]["conditions"][0]["status"] = json!(now);
                    kube.put(PODS, "default", p);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}
