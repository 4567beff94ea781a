//! A control plane from `scripts/control-plane.sh up` (etcd, kube-apiserver, controller-manager, scheduler, kwok),
//! for the tiers that start their own: its directory, kubeconfig and server, and `down` on drop (kept for
//! inspection with `TESSERA_CONTROL_PLANE_KEEP=1` when the test failed).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::workspace;

/// A running control plane, stopped on drop.
pub struct ControlPlane {
    /// Where its logs, certificates and kubeconfig are.
    pub dir: PathBuf,
    /// The cluster admin's kubeconfig.
    pub kubeconfig: PathBuf,
    /// The API server's URL.
    pub server: String,
}

impl ControlPlane {
    /// Starts one (`scripts/control-plane.sh up`), failing the test with the script's words if it cannot.
    pub fn up() -> ControlPlane {
        let started = Instant::now();
        let out = Command::new(workspace().join("scripts/control-plane.sh"))
            .arg("up")
            .stdin(Stdio::null())
            .output()
            .expect("run scripts/control-plane.sh up");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the control plane did not start (scripts/control-plane.sh up):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let field = |key: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("no {key}= line from control-plane.sh up:\n{stdout}"))
                .to_owned()
        };
        let cp = ControlPlane {
            dir: PathBuf::from(field("DIR")),
            kubeconfig: PathBuf::from(field("KUBECONFIG")),
            server: field("SERVER"),
        };
        eprintln!(
            "control plane up in {:.1} s at {} ({})",
            started.elapsed().as_secs_f64(),
            cp.server,
            cp.dir.display()
        );
        cp
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() && std::env::var_os("TESSERA_CONTROL_PLANE_KEEP").is_some() {
            eprintln!(
                "TESSERA_CONTROL_PLANE_KEEP: left running in {} (scripts/control-plane.sh down {0})",
                self.dir.display()
            );
            return;
        }
        let _ = Command::new(workspace().join("scripts/control-plane.sh"))
            .arg("down")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .status();
    }
}
