//! What Tessera answers KEDA's external-scaler calls for one model: which model a `ScaledObject` may name, the
//! metric it reports, and whether the model is active.
//!
//! The number KEDA scales on is Tessera's own decision (`status.desiredReplicas`), reported with a target of 1 so
//! that the HPA KEDA creates (`AverageValue`, the external scaler's default) computes `ceil(value / 1)` = that
//! decision. Scale to and from zero is KEDA's activation: active while Tessera wants a replica or a request is
//! held at an activator. A `signal` in the trigger's metadata may choose a raw signal instead (its total over the
//! replicas against the InferenceAutoscaler's per-replica target), for teams that want KEDA's HPA to do the
//! arithmetic.
//!
//! Missing data is never a zero: a model with no decision yet, or one Tessera scales itself, is a refusal the
//! gRPC layer turns into an error, and KEDA then keeps the replicas (or applies its `fallback`).

use std::collections::BTreeMap;

use crate::scale::Signal;

/// The `scalerMetadata` key naming the model: `<namespace>/<name>` or `<name>` (the ScaledObject's namespace).
pub const MODEL_KEY: &str = "model";
/// The `scalerMetadata` key choosing the signal (default [`KedaSignal::DesiredReplicas`]).
pub const SIGNAL_KEY: &str = "signal";

/// The number a ScaledObject scales on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KedaSignal {
    /// Tessera's decision, every rule included (the default).
    DesiredReplicas,
    /// One of the decision's input signals, summed over the replicas, against its per-replica target.
    Raw(Signal),
}

impl KedaSignal {
    /// Every name `signal:` accepts, for the error that lists them.
    pub const NAMES: [&'static str; 5] = [
        "desiredReplicas",
        "kvCacheUtilization",
        "waitingRequestsPerReplica",
        "ttftP95",
        "requestsPerSecondPerReplica",
    ];

    /// Parses the `signal` metadata (absent: the decision).
    pub fn parse(value: Option<&str>) -> Result<Self, Refusal> {
        let Some(v) = value else {
            return Ok(Self::DesiredReplicas);
        };
        if v == "desiredReplicas" {
            return Ok(Self::DesiredReplicas);
        }
        Signal::from_field(v)
            .map(Self::Raw)
            .ok_or_else(|| Refusal::Invalid(format!("signal {v:?} is not one of {}", Self::NAMES.join(", "))))
    }

    /// The metric's name in `GetMetricSpec` and `GetMetrics` (KEDA prefixes it with the trigger's index).
    pub fn metric_name(self) -> String {
        match self {
            Self::DesiredReplicas => "tessera-desired-replicas".to_owned(),
            Self::Raw(s) => format!("tessera-{}", s.label().replace('_', "-")),
        }
    }
}

/// The InferenceAutoscaler a ScaledObject asks about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelRef {
    /// Its namespace (always the ScaledObject's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for ModelRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a call gets no metric. Each maps to one gRPC code; none of them is ever answered with a zero.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Refusal {
    /// The metadata is malformed (`INVALID_ARGUMENT`).
    #[error("{0}")]
    Invalid(String),
    /// The model is in another namespace than the ScaledObject (`PERMISSION_DENIED`): tenants are namespaces.
    #[error(
        "model {model} is in another namespace than the ScaledObject ({scaled_object_namespace}): a ScaledObject \
         may only scale on a model of its own namespace"
    )]
    OtherNamespace {
        /// The model asked for.
        model: String,
        /// The ScaledObject's namespace.
        scaled_object_namespace: String,
    },
    /// No InferenceAutoscaler of that name (`NOT_FOUND`).
    #[error(
        "no InferenceAutoscaler {0}: create one for the model (spec.scaledBy: KEDA) or fix scalerMetadata.model"
    )]
    NotFound(ModelRef),
    /// The InferenceAutoscaler scales its target itself (`FAILED_PRECONDITION`): one owner per `/scale`.
    #[error(
        "InferenceAutoscaler {0} scales its target itself (spec.scaledBy: Tessera): set spec.scaledBy: KEDA to \
         hand /scale to this ScaledObject, or delete the ScaledObject"
    )]
    ScaledByTessera(ModelRef),
    /// Tessera has not decided for the model yet, or not on its current spec (`UNAVAILABLE`: KEDA keeps the
    /// replicas or applies its fallback).
    #[error("no decision for {0} yet: the autoscaler has not reconciled it since it was created or changed")]
    NoDecision(ModelRef),
    /// The chosen raw signal has no value this round (`UNAVAILABLE`).
    #[error("{signal} has no value for {model} this round (no fresh sidecar data)")]
    NoSignal {
        /// The model.
        model: ModelRef,
        /// The signal's field name.
        signal: &'static str,
    },
}

impl Refusal {
    /// A fixed label for metrics.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// The model and signal a trigger's metadata names. `model` is required; a namespace in it must be the
/// ScaledObject's own.
pub fn parse_ref(
    scaled_object_namespace: &str,
    metadata: &BTreeMap<String, String>,
) -> Result<(ModelRef, KedaSignal), Refusal> {
    let Some(model) = metadata
        .get(MODEL_KEY)
        .map(|m| m.trim())
        .filter(|m| !m.is_empty())
    else {
        return Err(Refusal::Invalid(
            "the trigger's metadata has no `model`: set it to the InferenceAutoscaler's <namespace>/<name> (or \
             <name> in the ScaledObject's namespace)"
                .to_owned(),
        ));
    };
    // Tenants are namespaces: a reference that names no namespace of its own reads no model, whichever it
    // names (KEDA always sends the ScaledObject's; only a hand-made client leaves it out).
    if scaled_object_namespace.is_empty() {
        return Err(Refusal::OtherNamespace {
            model: model.to_owned(),
            scaled_object_namespace: "none given".to_owned(),
        });
    }
    let (namespace, name) = match model.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (scaled_object_namespace, model),
    };
    if namespace.is_empty() || name.is_empty() || name.contains('/') {
        return Err(Refusal::Invalid(format!(
            "model {model:?} is not <namespace>/<name> or <name>"
        )));
    }
    if namespace != scaled_object_namespace {
        return Err(Refusal::OtherNamespace {
            model: model.to_owned(),
            scaled_object_namespace: scaled_object_namespace.to_owned(),
        });
    }
    let signal = KedaSignal::parse(metadata.get(SIGNAL_KEY).map(String::as_str))?;
    Ok((
        ModelRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
        signal,
    ))
}

/// Who writes the target's `/scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScaleOwner {
    /// Tessera's controller (the default).
    #[default]
    Tessera,
    /// KEDA, through a ScaledObject whose trigger is Tessera's external scaler.
    Keda,
}

/// Another autoscaler found on the same workload: a HorizontalPodAutoscaler, KEDA's own when it carries the
/// `scaledobject.keda.sh/name` label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherScaler {
    /// The HPA's name.
    pub hpa: String,
    /// The ScaledObject that made it, when KEDA did.
    pub scaled_object: Option<String>,
}

impl std::fmt::Display for OtherScaler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.scaled_object {
            Some(so) => write!(f, "ScaledObject {so} (HPA {})", self.hpa),
            None => write!(f, "HorizontalPodAutoscaler {}", self.hpa),
        }
    }
}

/// Who writes `/scale` this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Tessera's controller writes it.
    Tessera,
    /// KEDA writes it; Tessera publishes its decision for the scaler. `scaled_object` is the one found, if any.
    Keda {
        /// The ScaledObject whose HPA targets the workload.
        scaled_object: Option<String>,
    },
    /// Two owners claim it: nobody is written by Tessera, and the message says what to change.
    Conflict(String),
}

/// One owner per `/scale`: from the spec's `scaledBy` and the other autoscalers on the same workload (`None`:
/// they could not be listed, and the spec is taken at its word).
pub fn ownership(owner: ScaleOwner, target: &str, others: Option<&[OtherScaler]>) -> Ownership {
    let others = others.unwrap_or_default();
    let list = |v: &[&OtherScaler]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    match owner {
        ScaleOwner::Tessera if others.is_empty() => Ownership::Tessera,
        ScaleOwner::Tessera => Ownership::Conflict(format!(
            "{} also scales {target}: one owner per /scale, so Tessera does not write it. Delete the other \
             autoscaler, or set spec.scaledBy: KEDA and make a ScaledObject whose trigger is Tessera's scaler",
            list(&others.iter().collect::<Vec<_>>())
        )),
        ScaleOwner::Keda => {
            let (keda, plain): (Vec<&OtherScaler>, Vec<&OtherScaler>) =
                others.iter().partition(|o| o.scaled_object.is_some());
            if !plain.is_empty() || keda.len() > 1 {
                let mut all = keda;
                all.extend(plain);
                return Ownership::Conflict(format!(
                    "{} scale {target}: with spec.scaledBy: KEDA exactly one ScaledObject may own /scale",
                    list(&all)
                ));
            }
            Ownership::Keda {
                scaled_object: keda.first().and_then(|o| o.scaled_object.clone()),
            }
        }
    }
}

/// One signal of the last decision, as the status shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PublishedSignal {
    /// Which signal.
    pub signal: Signal,
    /// Its per-replica value; `None` without fresh data.
    pub current: Option<f64>,
    /// Its per-replica target.
    pub target: f64,
}

/// What any autoscaler replica can read about a model: the leader's last decision (its status), and the
/// requests this replica's activator poll saw held.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// Who owns `/scale`.
    pub owner: ScaleOwner,
    /// The last decision, when the model has one on its current spec.
    pub desired_replicas: Option<u32>,
    /// The replica count that decision read.
    pub current_replicas: u32,
    /// The decision's signals.
    pub signals: Vec<PublishedSignal>,
    /// Requests held at the activators right now (a model at zero with one held must come up).
    pub held: u32,
}

/// The answer to `GetMetrics` and `IsActive` for one model and signal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer {
    /// The metric's value.
    pub value: f64,
    /// Its HPA target (`AverageValue`).
    pub target: f64,
    /// Whether KEDA should keep the workload above zero (or bring it up).
    pub active: bool,
}

/// What was published for `model`, when KEDA may scale it: it exists and `scaledBy: KEDA`.
fn handed_to_keda<'a>(model: &ModelRef, published: Option<&'a Published>) -> Result<&'a Published, Refusal> {
    let p = published.ok_or_else(|| Refusal::NotFound(model.clone()))?;
    if p.owner == ScaleOwner::Tessera {
        return Err(Refusal::ScaledByTessera(model.clone()));
    }
    Ok(p)
}

/// The answer for `model` on `signal`, from what was published (`None`: no such InferenceAutoscaler).
pub fn answer(
    model: &ModelRef,
    signal: KedaSignal,
    published: Option<&Published>,
) -> Result<Answer, Refusal> {
    let p = handed_to_keda(model, published)?;
    let held = p.held > 0;
    // A held request is demand even before the leader's next round: it must bring the model up now.
    let Some(desired) = p.desired_replicas else {
        if held {
            return Ok(Answer {
                value: 1.0,
                target: 1.0,
                active: true,
            });
        }
        return Err(Refusal::NoDecision(model.clone()));
    };
    let desired = if held { desired.max(1) } else { desired };
    let active = desired > 0;
    match signal {
        KedaSignal::DesiredReplicas => Ok(Answer {
            value: f64::from(desired),
            target: 1.0,
            active,
        }),
        KedaSignal::Raw(s) => {
            let found = p.signals.iter().find(|x| x.signal == s);
            let (Some(found), Some(current)) = (found, found.and_then(|x| x.current)) else {
                return Err(Refusal::NoSignal {
                    model: model.clone(),
                    signal: s.field(),
                });
            };
            // AverageValue divides the total by the target: the total is the per-replica mean times the
            // replicas that mean was taken over.
            Ok(Answer {
                value: current * f64::from(p.current_replicas.max(1)),
                target: found.target,
                active,
            })
        }
    }
}

/// The target for `GetMetricSpec`: it needs no decision (KEDA asks once, when it builds its HPA, possibly before
/// Tessera's first round), only a model KEDA may scale — and for a raw signal, the target the decision carries.
pub fn spec_target(
    model: &ModelRef,
    signal: KedaSignal,
    published: Option<&Published>,
) -> Result<f64, Refusal> {
    let p = handed_to_keda(model, published)?;
    match signal {
        KedaSignal::DesiredReplicas => Ok(1.0),
        KedaSignal::Raw(s) => {
            p.signals
                .iter()
                .find(|x| x.signal == s)
                .map(|x| x.target)
                .ok_or(Refusal::NoSignal {
                    model: model.clone(),
                    signal: s.field(),
                })
        }
    }
}

/// The two fields KEDA reads a value from: the integer (rounded up, so a fraction of a replica asks for one)
/// and the float. Both are filled: KEDA ignores a float of exactly 0.0 and falls back to the integer.
pub fn wire_value(value: f64) -> (i64, f64) {
    if !value.is_finite() || value <= 0.0 {
        return (0, 0.0);
    }
    #[allow(clippy::cast_possible_truncation)]
    let int = value.ceil().min(i64::MAX as f64) as i64;
    (int, value)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn model() -> ModelRef {
        ModelRef {
            namespace: "team-a".into(),
            name: "chat".into(),
        }
    }

    fn published(desired: Option<u32>, held: u32) -> Published {
        Published {
            owner: ScaleOwner::Keda,
            desired_replicas: desired,
            current_replicas: 2,
            signals: vec![PublishedSignal {
                signal: Signal::KvCacheUtilization,
                current: Some(0.6),
                target: 0.5,
            }],
            held,
        }
    }

    #[test]
    fn the_model_is_read_in_the_scaled_objects_namespace() {
        let (m, s) = parse_ref("team-a", &meta(&[("model", "chat")])).unwrap();
        assert_eq!((m, s), (model(), KedaSignal::DesiredReplicas));
        let (m, _) = parse_ref("team-a", &meta(&[("model", "team-a/chat")])).unwrap();
        assert_eq!(m, model());
    }

    #[test]
    fn another_namespaces_model_is_refused() {
        let e = parse_ref("team-b", &meta(&[("model", "team-a/chat")])).unwrap_err();
        assert_eq!(e.label(), "other_namespace");
        assert!(e.to_string().contains("team-a/chat"), "{e}");
        // A reference without a namespace (issue 53 N11) reads no model, not even by naming one's namespace.
        for model in ["team-b/llama", "llama"] {
            let e = parse_ref("", &meta(&[("model", model)])).unwrap_err();
            assert_eq!(e.label(), "other_namespace", "{model}");
        }
    }

    #[test]
    fn malformed_metadata_says_what_to_write() {
        let e = parse_ref("ns", &meta(&[])).unwrap_err();
        assert!(e.to_string().contains("no `model`"), "{e}");
        let e = parse_ref("ns", &meta(&[("model", "a/b/c")])).unwrap_err();
        assert_eq!(e.label(), "invalid");
        let e = parse_ref("ns", &meta(&[("model", "m"), ("signal", "cpu")])).unwrap_err();
        assert!(
            e.to_string().contains("kvCacheUtilization"),
            "lists the choices: {e}"
        );
    }

    #[test]
    fn the_decision_is_reported_against_a_target_of_one() {
        let a = answer(
            &model(),
            KedaSignal::DesiredReplicas,
            Some(&published(Some(3), 0)),
        )
        .unwrap();
        assert_eq!((a.value, a.target, a.active), (3.0, 1.0, true));
        let a = answer(
            &model(),
            KedaSignal::DesiredReplicas,
            Some(&published(Some(0), 0)),
        )
        .unwrap();
        assert_eq!((a.value, a.active), (0.0, false));
    }

    #[test]
    fn a_held_request_makes_a_model_at_zero_active() {
        let a = answer(
            &model(),
            KedaSignal::DesiredReplicas,
            Some(&published(Some(0), 2)),
        )
        .unwrap();
        assert_eq!((a.value, a.active), (1.0, true));
        // Even before the leader's first round.
        let a = answer(&model(), KedaSignal::DesiredReplicas, Some(&published(None, 1))).unwrap();
        assert!(a.active);
    }

    #[test]
    fn missing_data_is_a_refusal_never_a_zero() {
        let e = answer(&model(), KedaSignal::DesiredReplicas, None).unwrap_err();
        assert_eq!(e.label(), "not_found");
        let e = answer(&model(), KedaSignal::DesiredReplicas, Some(&published(None, 0))).unwrap_err();
        assert_eq!(e.label(), "no_decision");
        let mut p = published(Some(2), 0);
        p.signals[0].current = None;
        let e = answer(&model(), KedaSignal::Raw(Signal::KvCacheUtilization), Some(&p)).unwrap_err();
        assert_eq!(e.label(), "no_signal");
    }

    #[test]
    fn the_spec_needs_no_decision() {
        assert_eq!(
            spec_target(&model(), KedaSignal::DesiredReplicas, Some(&published(None, 0))),
            Ok(1.0)
        );
        let e = spec_target(&model(), KedaSignal::DesiredReplicas, None).unwrap_err();
        assert_eq!(e.label(), "not_found");
        assert_eq!(
            spec_target(
                &model(),
                KedaSignal::Raw(Signal::KvCacheUtilization),
                Some(&published(None, 0))
            ),
            Ok(0.5)
        );
    }

    #[test]
    fn a_model_tessera_scales_itself_is_not_handed_to_keda() {
        let mut p = published(Some(2), 0);
        p.owner = ScaleOwner::Tessera;
        let e = answer(&model(), KedaSignal::DesiredReplicas, Some(&p)).unwrap_err();
        assert!(e.to_string().contains("spec.scaledBy: KEDA"), "{e}");
    }

    #[test]
    fn a_raw_signal_is_the_total_against_the_per_replica_target() {
        let a = answer(
            &model(),
            KedaSignal::Raw(Signal::KvCacheUtilization),
            Some(&published(Some(3), 0)),
        )
        .unwrap();
        assert!((a.value - 1.2).abs() < 1e-9 && (a.target - 0.5).abs() < 1e-9);
        // HPA AverageValue: ceil(1.2 / 0.5) = 3, the replicas the signal asks for.
        assert_eq!((a.value / a.target).ceil(), 3.0);
    }

    #[test]
    fn both_wire_fields_carry_the_value() {
        assert_eq!(wire_value(3.0), (3, 3.0));
        assert_eq!(wire_value(1.2), (2, 1.2));
        assert_eq!(wire_value(0.0), (0, 0.0));
        assert_eq!(wire_value(f64::NAN), (0, 0.0));
    }

    fn hpa(name: &str, so: Option<&str>) -> OtherScaler {
        OtherScaler {
            hpa: name.into(),
            scaled_object: so.map(Into::into),
        }
    }

    #[test]
    fn one_owner_per_scale() {
        let t = "Deployment/chat";
        assert_eq!(ownership(ScaleOwner::Tessera, t, Some(&[])), Ownership::Tessera);
        assert_eq!(ownership(ScaleOwner::Tessera, t, None), Ownership::Tessera);
        let keda = [hpa("keda-hpa-chat", Some("chat"))];
        let Ownership::Conflict(m) = ownership(ScaleOwner::Tessera, t, Some(&keda)) else {
            panic!("a ScaledObject beside a Tessera-scaled model is a conflict")
        };
        assert!(
            m.contains("ScaledObject chat") && m.contains("spec.scaledBy: KEDA"),
            "{m}"
        );
        assert_eq!(
            ownership(ScaleOwner::Keda, t, Some(&keda)),
            Ownership::Keda {
                scaled_object: Some("chat".into())
            }
        );
        assert_eq!(
            ownership(ScaleOwner::Keda, t, Some(&[])),
            Ownership::Keda { scaled_object: None }
        );
        let both = [hpa("keda-hpa-chat", Some("chat")), hpa("chat-cpu", None)];
        assert!(
            matches!(ownership(ScaleOwner::Keda, t, Some(&both)), Ownership::Conflict(m) if m.contains("chat-cpu"))
        );
    }
}
