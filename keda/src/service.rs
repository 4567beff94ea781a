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
    /// One permit per open push stream: past [`DEFAULT_MAX_STREAMS`] (or the flag) a new one is refused.
    streams: Arc<tokio::sync::Semaphore>,
    /// The permits `streams` started with.
    max_streams: usize,
    /// How long a push stream stays open before it ends; KEDA opens a new one (and polls meanwhile).
    max_stream_age: Duration,
}

/// Push streams open at once, all clients together: KEDA holds one per `external-push` trigger.
pub const DEFAULT_MAX_STREAMS: usize = 1024;
/// A push stream's lifetime: KEDA reconnects an ended stream, so this bounds how long a stream a client left
/// without closing (or never reads) is held, at the cost of one reconnect per trigger per period.
pub const DEFAULT_MAX_STREAM_AGE: Duration = Duration::from_secs(600);

impl<S> Clone for Scaler<S> {
    fn clone(&self) -> Self {
        Self {
            source: self.source.clone(),
            metrics: self.metrics.clone(),
            check_every: self.check_every,
            stop: self.stop.clone(),
            streams: self.streams.clone(),
            max_streams: self.max_streams,
            max_stream_age: self.max_stream_age,
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
            streams: Arc::new(tokio::sync::Semaphore::new(DEFAULT_MAX_STREAMS)),
            max_streams: DEFAULT_MAX_STREAMS,
            max_stream_age: DEFAULT_MAX_STREAM_AGE,
        }
    }

    /// At most `max` push streams open at once, each open for at most `max_age`.
    pub fn with_stream_bounds(mut self, max: usize, max_age: Duration) -> Self {
        self.streams = Arc::new(tokio::sync::Semaphore::new(max));
        self.max_streams = max;
        self.max_stream_age = max_age;
        self
    }

    /// The service for a tonic or axum router.
    pub fn into_server(self) -> pb::external_scaler_server::ExternalScalerServer<Self> {
        pb::external_scaler_server::ExternalScalerServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn answer(&self, r: &pb::ScaledObjectRef) -> Result<(ModelRef, KedaSignal, Answer), Refusal> {
        let (model, signal, published) = self.read(r)?;
        let answer = keda::answer(&model, signal, published.as_ref())?;
        Ok((model, signal, answer))
    }

    fn read(&self, r: &pb::ScaledObjectRef) -> Result<(ModelRef, KedaSignal, Option<Published>), Refusal> {
        check_ref(r)?;
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

/// The longest name of a Kubernetes object (a DNS subdomain).
pub const MAX_NAME: usize = 253;
/// The longest namespace name (a DNS label).
pub const MAX_NAMESPACE: usize = 63;
/// The longest `model` (`<namespace>/<name>`).
pub const MAX_MODEL: usize = MAX_NAMESPACE + 1 + MAX_NAME;
/// The longest metadata value taken (`signal` and keys Tessera does not read).
pub const MAX_METADATA_VALUE: usize = 512;
/// The most metadata entries taken (KEDA sends the trigger's few).
pub const MAX_METADATA_ENTRIES: usize = 64;
/// The largest request message decoded (a `ScaledObjectRef` is a few hundred bytes): larger ones are refused by
/// the codec before they are held.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;

/// What a refusal quotes of an oversized value: its start and its length, never the whole.
fn preview(v: &str) -> String {
    const SHOWN: usize = 48;
    if v.chars().count() <= SHOWN {
        return format!("{v:?}");
    }
    let head: String = v.chars().take(SHOWN).collect();
    format!("{head:?}… ({} bytes)", v.len())
}

/// The reference's own bounds, checked before anything reads it, so that every refusal quotes a bounded name
/// (a refusal's message becomes the `grpc-message` trailer) and no namespace check is skipped:
/// - lengths are Kubernetes' own (a name ≤ 253 characters, a namespace ≤ 63);
/// - a reference without a namespace is refused: KEDA always sends the ScaledObject's, and a model is answered
///   only to a ScaledObject of its own namespace, which an empty one is not.
fn check_ref(r: &pb::ScaledObjectRef) -> Result<(), Refusal> {
    let too_long = |what: &str, v: &str, max: usize| {
        Refusal::Invalid(format!(
            "{what} {} is longer than {max} characters, the most Kubernetes allows",
            preview(v)
        ))
    };
    if r.namespace.len() > MAX_NAMESPACE {
        return Err(too_long("namespace", &r.namespace, MAX_NAMESPACE));
    }
    if r.name.len() > MAX_NAME {
        return Err(too_long("ScaledObject name", &r.name, MAX_NAME));
    }
    if r.scaler_metadata.len() > MAX_METADATA_ENTRIES {
        return Err(Refusal::Invalid(format!(
            "the trigger's metadata has {} entries; at most {MAX_METADATA_ENTRIES} are taken",
            r.scaler_metadata.len()
        )));
    }
    for (k, v) in &r.scaler_metadata {
        let max = if k == keda::MODEL_KEY {
            MAX_MODEL
        } else {
            MAX_METADATA_VALUE
        };
        if k.len() > MAX_NAME {
            return Err(too_long("metadata key", k, MAX_NAME));
        }
        if v.len() > max {
            return Err(Refusal::Invalid(format!(
                "metadata {k} = {} is longer than {max} characters{}",
                preview(v),
                if k == keda::MODEL_KEY {
                    ": a model is <namespace>/<name>, a namespace at most 63 characters and a name at most 253"
                } else {
                    ""
                }
            )));
        }
    }
    // A reference without a namespace is refused by `keda::parse_ref` (tenants are namespaces).
    Ok(())
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
        // Bounded in number: each open stream holds a task and a channel for as long as the client stays.
        let permit = self.streams.clone().try_acquire_owned().ok();
        let outcome = match (&first, &permit) {
            (Err(e), _) => e.label(),
            (Ok(_), None) => "too_many_streams",
            (Ok(_), Some(_)) => "ok",
        };
        self.metrics
            .call("StreamIsActive", outcome, started.elapsed().as_secs_f64());
        let (model, _, answer) = first.map_err(|e| status_of(&e))?;
        let Some(permit) = permit else {
            return Err(Status::resource_exhausted(format!(
                "{} push streams are open, the most this scaler holds (--keda-max-streams); KEDA polls IsActive \
                 meanwhile",
                self.max_streams
            )));
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let this = self.clone();
        tokio::spawn(async move {
            this.push(r, model, answer.active, tx).await;
            drop(permit);
        });
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
        let end_of_life = tokio::time::sleep(self.max_stream_age);
        tokio::pin!(end_of_life);
        while sent {
            tokio::select! {
                () = &mut end_of_life => break,
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tessera_core::keda::ScaleOwner;

    /// One model, `team-a/llama`, handed to KEDA with a decision (the default signal: the decision).
    struct One(broadcast::Sender<ModelRef>);

    impl Source for One {
        fn published(&self, model: &ModelRef) -> Option<Published> {
            (model.namespace == "team-a" && model.name == "llama").then(|| Published {
                owner: ScaleOwner::Keda,
                desired_replicas: Some(1),
                current_replicas: 1,
                signals: Vec::new(),
                held: 0,
            })
        }
        fn changes(&self) -> broadcast::Receiver<ModelRef> {
            self.0.subscribe()
        }
    }

    fn scaler() -> (Scaler<One>, watch::Sender<bool>) {
        let (stop_tx, stop) = watch::channel(false);
        let source = Arc::new(One(broadcast::channel(4).0));
        let s = Scaler::new(source, Metrics::default(), Duration::from_secs(1), stop);
        (s, stop_tx)
    }

    fn with(namespace: &str, model: &str) -> pb::ScaledObjectRef {
        pb::ScaledObjectRef {
            name: "so".into(),
            namespace: namespace.into(),
            scaler_metadata: [("model".to_owned(), model.to_owned())].into_iter().collect(),
        }
    }

    async fn is_active(s: &Scaler<One>, r: pb::ScaledObjectRef) -> Result<bool, Status> {
        s.is_active(Request::new(r)).await.map(|r| r.into_inner().result)
    }

    #[tokio::test]
    async fn the_own_model_is_answered() {
        let (s, _stop) = scaler();
        assert!(is_active(&s, with("team-a", "llama")).await.unwrap());
        assert!(is_active(&s, with("team-a", "team-a/llama")).await.unwrap());
    }

    /// Issue 53, N11: a reference without a namespace is refused as another namespace's (it was NOT_FOUND for
    /// `team-b/llama`, an answer for `team-a/llama`).
    #[tokio::test]
    async fn a_reference_without_a_namespace_reads_no_model() {
        let (s, _stop) = scaler();
        for model in ["team-a/llama", "team-b/llama", "llama"] {
            let e = is_active(&s, with("", model)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{model}: {e:?}");
            assert!(e.message().contains("none given"), "{}", e.message());
        }
    }

    /// Issue 53, N10: an oversized name is refused with a bounded message (it was echoed whole into the
    /// `grpc-message` trailer).
    #[tokio::test]
    async fn oversized_names_are_refused_without_being_echoed() {
        let (s, _stop) = scaler();
        let huge = "a".repeat(3_600_000);
        for r in [
            with("team-a", &format!("team-a/{huge}")),
            with("team-a", &huge),
            with(&huge, "llama"),
            pb::ScaledObjectRef {
                name: huge.clone(),
                ..with("team-a", "llama")
            },
            pb::ScaledObjectRef {
                scaler_metadata: [
                    ("model".to_owned(), "llama".to_owned()),
                    ("signal".to_owned(), huge.clone()),
                ]
                .into_iter()
                .collect(),
                ..with("team-a", "llama")
            },
        ] {
            let e = is_active(&s, r).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{}", &e.message()[..200]);
            assert!(e.message().len() < 400, "{} characters", e.message().len());
            assert!(e.message().contains("bytes) is longer than"), "{}", e.message());
        }
        // The longest real names still pass the bounds (and are then looked up).
        let name = "n".repeat(MAX_NAME);
        let e = is_active(&s, with(&"s".repeat(MAX_NAMESPACE), &name))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
    }

    /// Issue 53, N9: push streams are bounded in number and in lifetime.
    #[tokio::test]
    async fn push_streams_are_bounded_in_number_and_age() {
        use futures::StreamExt;
        let (s, _stop) = scaler();
        let s = s.with_stream_bounds(2, Duration::from_millis(300));
        let open = || s.stream_is_active(Request::new(with("team-a", "llama")));
        let mut a = open().await.unwrap().into_inner();
        let _b = open().await.unwrap().into_inner();
        let e = open().await.err().unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("--keda-max-streams"), "{}", e.message());
        assert!(a.next().await.unwrap().unwrap().result);
        // Past its age the stream ends (KEDA reconnects), and its room is given back.
        let started = tokio::time::Instant::now();
        assert!(a.next().await.is_none());
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{:?}",
            started.elapsed()
        );
        drop(a);
        tokio::task::yield_now().await;
        assert!(open().await.is_ok());
    }
}
