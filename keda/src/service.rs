//! The four calls of `externalscaler.ExternalScaler`, as KEDA makes them:
//!
//! - `GetMetricSpec` once per ScaledObject (and when it changes): one metric, target 1 for the decision;
//! - per polling interval, `GetMetrics` then `IsActive`;
//! - for an `external-push` trigger, `StreamIsActive` stays open and Tessera pushes the moment the model
//!   becomes active (a request held at an activator), so a scale from zero does not wait for KEDA's next poll.
//!
//! Each answer comes from [`tessera_core::keda::answer`] on what the [`Source`] published; a refusal is a gRPC
//! error with the rule's message, never a zero.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use tessera_core::keda::{self, Answer, KedaSignal, ModelRef, Published, Refusal};
use tokio::sync::{broadcast, watch};
use tonic::{Request, Response, Status};
use tracing::debug;

use crate::metrics::Metrics;
use crate::pb;
use crate::pb::external_scaler_server::ExternalScaler;

/// Where the scaler reads what Tessera decided.
pub trait Source: Send + Sync + 'static {
    /// What is published for the model (`None`: no InferenceAutoscaler of that name).
    fn published(&self, model: &ModelRef) -> Option<Published>;
    /// Fires with a model whose answer may have changed (a request held, a new decision); a push stream
    /// re-reads its model at once instead of at its next check.
    fn changes(&self) -> broadcast::Receiver<ModelRef>;
}

/// The gRPC service.
#[derive(Debug)]
pub struct Scaler<S> {
    source: Arc<S>,
    metrics: Metrics,
    /// How often an open push stream re-reads its model when nothing told it to.
    check_every: Duration,
    /// Set when the server stops: open streams end so connections can drain.
    stop: watch::Receiver<bool>,
}

impl<S> Clone for Scaler<S> {
    fn clone(&self) -> Self {
        Self {
            source: self.source.clone(),
            metrics: self.metrics.clone(),
            check_every: self.check_every,
            stop: self.stop.clone(),
        }
    }
}

impl<S: Source> Scaler<S> {
    /// A scaler over `source`; push streams re-check every `check_every` and end when `stop` turns true.
    pub fn new(source: Arc<S>, metrics: Metrics, check_every: Duration, stop: watch::Receiver<bool>) -> Self {
        Self {
            source,
            metrics,
            check_every,
            stop,
        }
    }

    /// The service for a tonic or axum router.
    pub fn into_server(self) -> pb::external_scaler_server::ExternalScalerServer<Self> {
        pb::external_scaler_server::ExternalScalerServer::new(self)
    }

    fn answer(&self, r: &pb::ScaledObjectRef) -> Result<(ModelRef, KedaSignal, Answer), Refusal> {
        let (model, signal, published) = self.read(r)?;
        let answer = keda::answer(&model, signal, published.as_ref())?;
        Ok((model, signal, answer))
    }

    fn read(&self, r: &pb::ScaledObjectRef) -> Result<(ModelRef, KedaSignal, Option<Published>), Refusal> {
        let metadata: BTreeMap<String, String> = r
            .scaler_metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let (model, signal) = keda::parse_ref(&r.namespace, &metadata)?;
        let published = self.source.published(&model);
        Ok((model, signal, published))
    }

    /// Runs `f` on the call's answer, counting the call and turning a refusal into its gRPC status.
    fn call<T>(
        &self,
        method: &'static str,
        r: &pb::ScaledObjectRef,
        f: impl FnOnce(KedaSignal, Answer) -> T,
    ) -> Result<Response<T>, Status> {
        self.counted(method, r, || self.answer(r), f)
    }

    /// Counts one call of `method` answered by `answer`, turning a refusal into its gRPC status.
    fn counted<A: std::fmt::Debug, T>(
        &self,
        method: &'static str,
        r: &pb::ScaledObjectRef,
        answer: impl FnOnce() -> Result<(ModelRef, KedaSignal, A), Refusal>,
        f: impl FnOnce(KedaSignal, A) -> T,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let result = answer();
        let outcome = result.as_ref().map_or_else(Refusal::label, |_| "ok");
        self.metrics
            .call(method, outcome, started.elapsed().as_secs_f64());
        match result {
            Ok((model, signal, answer)) => {
                debug!(%model, method, ?answer, "answered KEDA");
                Ok(Response::new(f(signal, answer)))
            }
            Err(refusal) => {
                debug!(method, scaled_object = %r.name, namespace = %r.namespace, %refusal, "refused KEDA");
                Err(status_of(&refusal))
            }
        }
    }
}

/// The gRPC status of a refusal.
pub fn status_of(refusal: &Refusal) -> Status {
    let message = refusal.to_string();
    match refusal {
        Refusal::Invalid(_) => Status::invalid_argument(message),
        Refusal::OtherNamespace { .. } => Status::permission_denied(message),
        Refusal::NotFound(_) => Status::not_found(message),
        Refusal::ScaledByTessera(_) => Status::failed_precondition(message),
        Refusal::NoDecision(_) | Refusal::NoSignal { .. } => Status::unavailable(message),
    }
}

type ActiveStream = Pin<Box<dyn Stream<Item = Result<pb::IsActiveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<S: Source> ExternalScaler for Scaler<S> {
    async fn is_active(
        &self,
        request: Request<pb::ScaledObjectRef>,
    ) -> Result<Response<pb::IsActiveResponse>, Status> {
        self.call("IsActive", request.get_ref(), |_, a| pb::IsActiveResponse {
            result: a.active,
        })
    }

    type StreamIsActiveStream = ActiveStream;

    async fn stream_is_active(
        &self,
        request: Request<pb::ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let r = request.into_inner();
        // A stream that cannot be answered now is refused at once, with the reason, rather than left silent.
        let started = Instant::now();
        let first = self.answer(&r);
        let outcome = first.as_ref().map_or_else(Refusal::label, |_| "ok");
        self.metrics
            .call("StreamIsActive", outcome, started.elapsed().as_secs_f64());
        let (model, _, answer) = first.map_err(|e| status_of(&e))?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let this = self.clone();
        tokio::spawn(async move { this.push(r, model, answer.active, tx).await });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn get_metric_spec(
        &self,
        request: Request<pb::ScaledObjectRef>,
    ) -> Result<Response<pb::GetMetricSpecResponse>, Status> {
        let r = request.get_ref();
        // The spec needs no decision: KEDA asks for it when it builds its HPA, perhaps before the first round.
        let spec = || {
            let (model, signal, published) = self.read(r)?;
            let target = keda::spec_target(&model, signal, published.as_ref())?;
            Ok((model, signal, target))
        };
        self.counted("GetMetricSpec", r, spec, |signal, target| {
            let (size, size_float) = keda::wire_value(target);
            pb::GetMetricSpecResponse {
                metric_specs: vec![pb::MetricSpec {
                    metric_name: signal.metric_name(),
                    target_size: size,
                    target_size_float: size_float,
                }],
            }
        })
    }

    async fn get_metrics(
        &self,
        request: Request<pb::GetMetricsRequest>,
    ) -> Result<Response<pb::GetMetricsResponse>, Status> {
        let req = request.into_inner();
        let r = req.scaled_object_ref.unwrap_or_default();
        self.call("GetMetrics", &r, |signal, a| {
            let (value, value_float) = keda::wire_value(a.value);
            pb::GetMetricsResponse {
                metric_values: vec![pb::MetricValue {
                    // KEDA asks with its own (prefixed) name and matches the answer on it.
                    metric_name: if req.metric_name.is_empty() {
                        signal.metric_name()
                    } else {
                        req.metric_name.clone()
                    },
                    metric_value: value,
                    metric_value_float: value_float,
                }],
            }
        })
    }
}

impl<S: Source> Scaler<S> {
    /// One push stream: the first value at once, then every change of the model's activity, re-read when the
    /// source says the model changed and at least every `check_every`. KEDA acts on `true` only; a `false` is sent
    /// so a client that logs the stream sees the model go idle. Ends when the client leaves, the model can no
    /// longer be answered (the refusal is sent), or the server stops.
    async fn push(
        self,
        r: pb::ScaledObjectRef,
        model: ModelRef,
        first: bool,
        tx: tokio::sync::mpsc::Sender<Result<pb::IsActiveResponse, Status>>,
    ) {
        self.metrics.stream(1);
        let mut changes = self.source.changes();
        let mut stop = self.stop.clone();
        let mut last = first;
        self.metrics.pushed(first);
        let mut sent = tx.send(Ok(pb::IsActiveResponse { result: first })).await.is_ok();
        while sent {
            tokio::select! {
                () = tokio::time::sleep(self.check_every) => {}
                changed = changes.recv() => match changed {
                    Ok(m) if m != model => continue,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                _ = stop.wait_for(|s| *s) => break,
                () = tx.closed() => break,
            }
            match self.answer(&r) {
                Ok((_, _, a)) if a.active != last => {
                    last = a.active;
                    self.metrics.pushed(last);
                    sent = tx.send(Ok(pb::IsActiveResponse { result: last })).await.is_ok();
                }
                Ok(_) => {}
                Err(refusal) => {
                    let _ = tx.send(Err(status_of(&refusal))).await;
                    break;
                }
            }
        }
        self.metrics.stream(-1);
    }
}
