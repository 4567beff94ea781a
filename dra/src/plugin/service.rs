//! The two gRPC services the kubelet calls, from its published API (`proto/`):
//! - `pluginregistration.Registration` on the registration socket: the kubelet's plugin watcher finds the socket
//!   in its registry directory, asks [`GetInfo`](Registration::get_info) — type `DRAPlugin`, the driver's name,
//!   the DRA socket's path, and the services offered as `<package>.<service>` (`v1.DRAPlugin`, the only one a
//!   1.36 kubelet prefers; it also speaks `v1beta1.DRAPlugin`, not offered) — and reports the outcome with
//!   `NotifyRegistrationStatus`;
//! - `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` on the DRA socket: `NodePrepareResources` and
//!   `NodeUnprepareResources`, answered per claim UID ([`Driver`]). The kubelet treats a call's own error as
//!   every claim failing, so the call itself never fails; each claim's error is in its entry.

use std::sync::Arc;

use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::{error, info};

use super::checkpoint::PreparedDevice;
use super::pb::dra::dra_plugin_server::DraPlugin;
use super::pb::dra::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use super::pb::registration::registration_server::Registration;
use super::pb::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use super::prepare::{ClaimRef, Driver};
use super::source::ClaimSource;
use crate::DRIVER;

/// The plugin type the kubelet's plugin watcher routes to its DRA manager.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA services this plugin offers (`k8s.io/kubelet/pkg/apis/dra/v1.DRAPluginService`).
pub const SUPPORTED_SERVICES: &[&str] = &["v1.DRAPlugin"];

/// `DRAPlugin` over a [`Driver`].
#[derive(Debug)]
pub struct DraService<S> {
    driver: Arc<Driver<S>>,
}

impl<S> DraService<S> {
    /// The service preparing with `driver`.
    pub fn new(driver: Arc<Driver<S>>) -> Self {
        Self { driver }
    }
}

fn refs(claims: Vec<Claim>) -> Vec<ClaimRef> {
    claims
        .into_iter()
        .map(|c| ClaimRef {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

fn device(d: PreparedDevice) -> Device {
    Device {
        request_names: d.request_names,
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_device_ids,
        share_id: d.share_id,
    }
}

#[tonic::async_trait]
impl<S: ClaimSource> DraPlugin for DraService<S> {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let answers = self.driver.prepare(&refs(request.into_inner().claims)).await;
        let claims = answers
            .into_iter()
            .map(|(uid, r)| {
                let answer = match r {
                    Ok(devices) => NodePrepareResourceResponse {
                        devices: devices.into_iter().map(device).collect(),
                        error: String::new(),
                    },
                    Err(e) => NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e.to_string(),
                    },
                };
                (uid, answer)
            })
            .collect();
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let answers = self.driver.unprepare(&refs(request.into_inner().claims)).await;
        let claims = answers
            .into_iter()
            .map(|(uid, r)| {
                let error = r.err().map(|e| e.to_string()).unwrap_or_default();
                (uid, NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// What the kubelet last said of the registration: `None` before it said anything, else `Ok` or its error.
pub type Registered = Option<Result<(), String>>;

/// `Registration`: who this plugin is and where its DRA socket is.
#[derive(Debug)]
pub struct RegistrationService {
    endpoint: String,
    status: watch::Sender<Registered>,
}

impl RegistrationService {
    /// The service naming `endpoint` (the DRA socket's path as the kubelet reaches it).
    pub fn new(endpoint: String) -> Self {
        Self {
            endpoint,
            status: watch::Sender::new(None),
        }
    }

    /// Follows what the kubelet reports.
    pub fn status(&self) -> watch::Receiver<Registered> {
        self.status.subscribe()
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_SERVICES.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            info!(driver = DRIVER, "registered with the kubelet");
            self.status.send_replace(Some(Ok(())));
        } else {
            error!(driver = DRIVER, error = %s.error, "the kubelet refused the registration");
            self.status.send_replace(Some(Err(s.error)));
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
