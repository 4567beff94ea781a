//! The engine driver: one task owns the [`Engine`] and runs it in wall-clock time.
//!
//! Handlers talk to it over one mpsc channel. The task sleeps until the step in flight ends
//! ([`Engine::next_event_time`]) or a command arrives, whichever is first, then advances the engine to "now" and
//! pushes each request's tokens into that request's own channel. One task and no locks keep the model exactly
//! as deterministic as it is in the simulator; the per-token work is a channel send, so hundreds of concurrent
//! streams cost little.
//!
//! Virtual time is wall time since start, minus the time spent asleep, times `time_scale`: with `time_scale`
//! 10 the emulated GPU runs ten times faster than a real one would (for quick tests), and the latencies in
//! `/metrics` stay in the model's seconds.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::model::{Engine, EngineEvent, EngineStats, FinishReason, ModelError, Request};

use super::metrics::SleepState;

/// What a request's stream receives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tok {
    /// One output token (the first included).
    Token,
    /// The request is done.
    Finished {
        /// Why.
        reason: FinishReason,
        /// Output tokens produced.
        output_tokens: u32,
    },
}

/// A command to the driver task.
#[derive(Debug)]
pub enum Cmd {
    /// Add a request; its tokens go to `tokens`.
    Submit {
        req: Request,
        tokens: mpsc::UnboundedSender<Tok>,
        reply: oneshot::Sender<Result<(), ModelError>>,
    },
    /// A copy of the engine's statistics and the sleep state.
    Stats(oneshot::Sender<(EngineStats, SleepState)>),
    /// Pause the engine (sleep mode).
    Sleep(SleepState, oneshot::Sender<()>),
    /// Resume it.
    WakeUp(oneshot::Sender<()>),
    /// Abort every request in the engine (`/sleep?mode=abort`); replies with how many were aborted.
    AbortAll(oneshot::Sender<usize>),
}

/// A cheap, cloneable handle to the driver task.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Cmd>,
}

/// The driver task has stopped (only at shutdown).
#[derive(Debug, thiserror::Error)]
#[error("the engine task has stopped")]
pub struct EngineGone;

impl EngineHandle {
    /// Starts the driver task for `engine`.
    pub fn spawn(engine: Engine, time_scale: f64) -> EngineHandle {
        // A bounded queue: under overload handlers wait here instead of growing memory without limit.
        let (tx, rx) = mpsc::channel(4096);
        tokio::spawn(drive(engine, rx, time_scale));
        EngineHandle { tx }
    }

    /// Submits a request; `Ok(Err(_))` when the model rejects it (too long, …).
    pub async fn submit(
        &self,
        req: Request,
    ) -> Result<Result<mpsc::UnboundedReceiver<Tok>, ModelError>, EngineGone> {
        let (tokens, rx) = mpsc::unbounded_channel();
        let (reply, ack) = oneshot::channel();
        self.tx
            .send(Cmd::Submit { req, tokens, reply })
            .await
            .map_err(|_| EngineGone)?;
        Ok(ack.await.map_err(|_| EngineGone)?.map(|()| rx))
    }

    /// The engine's statistics now.
    pub async fn stats(&self) -> Result<(EngineStats, SleepState), EngineGone> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Cmd::Stats(reply)).await.map_err(|_| EngineGone)?;
        rx.await.map_err(|_| EngineGone)
    }

    /// Puts the engine to sleep.
    pub async fn sleep(&self, level: SleepState) -> Result<(), EngineGone> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Sleep(level, reply))
            .await
            .map_err(|_| EngineGone)?;
        rx.await.map_err(|_| EngineGone)
    }

    /// Aborts every request in the engine (their streams end); returns how many.
    pub async fn abort_all(&self) -> Result<usize, EngineGone> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Cmd::AbortAll(reply)).await.map_err(|_| EngineGone)?;
        rx.await.map_err(|_| EngineGone)
    }

    /// Wakes the engine.
    pub async fn wake_up(&self) -> Result<(), EngineGone> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Cmd::WakeUp(reply)).await.map_err(|_| EngineGone)?;
        rx.await.map_err(|_| EngineGone)
    }
}

/// Maps between wall time and the engine's virtual time.
struct Clock {
    start: Instant,
    asleep_total: Duration,
    asleep_since: Option<Instant>,
    scale: f64,
}

impl Clock {
    fn now(&self) -> f64 {
        let asleep = self.asleep_total + self.asleep_since.map_or(Duration::ZERO, |t| t.elapsed());
        (self.start.elapsed().saturating_sub(asleep)).as_secs_f64() * self.scale
    }

    fn wall(&self, virtual_s: f64) -> Instant {
        self.start + self.asleep_total + Duration::from_secs_f64((virtual_s / self.scale).max(0.0))
    }
}

async fn drive(mut engine: Engine, mut rx: mpsc::Receiver<Cmd>, time_scale: f64) {
    let mut clock = Clock {
        start: Instant::now(),
        asleep_total: Duration::ZERO,
        asleep_since: None,
        scale: time_scale,
    };
    let mut streams: HashMap<u64, mpsc::UnboundedSender<Tok>> = HashMap::new();
    let mut sleep = SleepState::Awake;
    let mut gone: Vec<u64> = Vec::new();
    let mut last_sweep = Instant::now();
    loop {
        if sleep == SleepState::Awake {
            let now = clock.now();
            engine.advance(now, &mut |ev| dispatch(ev, &mut streams, &mut gone));
            // A request still waiting in the queue produces no tokens, so its client's departure is only seen
            // by looking; once a second is enough and costs one check per stream.
            if last_sweep.elapsed() >= Duration::from_secs(1) {
                last_sweep = Instant::now();
                gone.extend(streams.iter().filter(|(_, tx)| tx.is_closed()).map(|(id, _)| *id));
            }
            // Clients that went away: abort their requests so they stop holding blocks, as vLLM does.
            for id in gone.drain(..) {
                streams.remove(&id);
                if engine.abort(id, now) {
                    debug!(id, "client went away; request aborted");
                }
            }
        }
        let deadline = match sleep {
            SleepState::Awake => engine.next_event_time().map(|t| clock.wall(t)),
            _ => None,
        };
        let cmd = match deadline {
            Some(at) => tokio::select! {
                biased;
                cmd = rx.recv() => cmd,
                () = tokio::time::sleep_until(at) => continue,
            },
            None => rx.recv().await,
        };
        let Some(cmd) = cmd else { break };
        match cmd {
            Cmd::Submit { req, tokens, reply } => {
                let now = clock.now();
                // Run steps that ended before this arrival first, so the request joins the right step.
                if sleep == SleepState::Awake {
                    engine.advance(now, &mut |ev| dispatch(ev, &mut streams, &mut gone));
                }
                let res = engine.submit(req, now);
                if res.is_ok() {
                    streams.insert(req.id, tokens);
                }
                let _ = reply.send(res);
            }
            Cmd::Stats(reply) => {
                if sleep == SleepState::Awake {
                    engine.advance(clock.now(), &mut |ev| dispatch(ev, &mut streams, &mut gone));
                }
                let _ = reply.send((engine.stats().clone(), sleep));
            }
            Cmd::Sleep(level, reply) => {
                if sleep == SleepState::Awake {
                    engine.advance(clock.now(), &mut |ev| dispatch(ev, &mut streams, &mut gone));
                    clock.asleep_since = Some(Instant::now());
                    info!(?level, in_flight = engine.in_flight(), "engine put to sleep");
                }
                sleep = level;
                let _ = reply.send(());
            }
            Cmd::WakeUp(reply) => {
                if let Some(since) = clock.asleep_since.take() {
                    clock.asleep_total += since.elapsed();
                    info!("engine woken up");
                }
                sleep = SleepState::Awake;
                let _ = reply.send(());
            }
            Cmd::AbortAll(reply) => {
                let now = clock.now();
                if sleep == SleepState::Awake {
                    engine.advance(now, &mut |ev| dispatch(ev, &mut streams, &mut gone));
                }
                // Dropping each stream's sender ends the client's response, as vLLM's abort does.
                let ids: Vec<u64> = streams.drain().map(|(id, _)| id).collect();
                let aborted = ids.into_iter().filter(|id| engine.abort(*id, now)).count();
                info!(aborted, "aborted every request in flight");
                let _ = reply.send(aborted);
            }
        }
    }
    debug!("engine driver stopped");
}

fn dispatch(ev: EngineEvent, streams: &mut HashMap<u64, mpsc::UnboundedSender<Tok>>, gone: &mut Vec<u64>) {
    let (id, tok, last) = match ev {
        EngineEvent::FirstToken { id, .. } | EngineEvent::Token { id, .. } => (id, Tok::Token, false),
        EngineEvent::Finished {
            id,
            reason,
            output_tokens,
            ..
        } => (
            id,
            Tok::Finished {
                reason,
                output_tokens,
            },
            true,
        ),
        EngineEvent::Preempted { .. } => return,
    };
    if last {
        if let Some(tx) = streams.remove(&id) {
            let _ = tx.send(tok);
        }
    } else if let Some(tx) = streams.get(&id)
        && tx.send(tok).is_err()
    {
        gone.push(id);
    }
}
