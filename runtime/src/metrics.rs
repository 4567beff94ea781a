//! One way to add a metric to a `prometheus-client` registry: make it, register it under its name and help,
//! and keep the handle that updates it (a clone shares the series with the registered copy).

use prometheus_client::registry::{Metric, Registry, Unit};

/// Registers a fresh `M::default()` as `name` with `help` and returns the handle that updates it.
pub fn register<M: Metric + Clone + Default>(registry: &mut Registry, name: &str, help: &str) -> M {
    register_value(registry, name, help, M::default())
}

/// Like [`register`], for a metric built by the caller (a histogram with its buckets, a family with a
/// constructor).
pub fn register_value<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Like [`register_value`], with a unit (the name gets its suffix, e.g. `_seconds`).
pub fn register_with_unit<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    unit: Unit,
    metric: M,
) -> M {
    registry.register_with_unit(name, help, unit, metric.clone());
    metric
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn the_returned_handle_updates_the_registered_metric() {
        let mut registry = Registry::default();
        let c: Counter = register(&mut registry, "calls", "Calls");
        c.inc();
        let mut page = String::new();
        prometheus_client::encoding::text::encode(&mut page, &registry).expect("encode");
        assert!(page.contains("calls_total 1"), "{page}");
    }
}
