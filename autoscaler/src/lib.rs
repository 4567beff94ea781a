//! The autoscaler role: the InferenceAutoscaler controller, the activator gateway, and the GPU pool manager.

pub mod activator;
pub mod controller;
pub mod crd;
pub mod leader;
pub mod pool;
mod watch;
