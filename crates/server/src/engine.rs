//! The server's side of the engine's scheduler thread
//! (`hearth_engine::scheduler`): a job's events come back through a tokio
//! channel the HTTP response reads, and session resets and closes are
//! awaited. The scheduling itself, and the token loop, live in the engine.

use hearth_engine::scheduler::{Event, EventSink, Job, SchedulerError, SchedulerHandle};
use tokio::sync::{mpsc, oneshot};

use crate::error::ApiError;

/// A job's events, delivered to the request's response.
pub struct ChannelSink(pub mpsc::UnboundedSender<Event>);

impl EventSink for ChannelSink {
    fn send(&self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

impl From<SchedulerError> for ApiError {
    fn from(e: SchedulerError) -> ApiError {
        match e {
            SchedulerError::Unavailable(m) => ApiError::unavailable(m),
            SchedulerError::Capacity(m) => ApiError::capacity(m),
            SchedulerError::InvalidSampling(m) => ApiError::invalid("invalid_value", m),
            SchedulerError::Constraint(m) => ApiError::invalid(
                "output_constraint_failed",
                format!("{m} (during generation; simplify the schema or grammar)"),
            ),
            SchedulerError::Failed(m) => ApiError::server(m),
            SchedulerError::Internal(m) => ApiError::internal(m),
        }
    }
}

/// The requests' handle on the scheduler.
#[derive(Clone)]
pub struct EngineHandle(pub SchedulerHandle);

impl EngineHandle {
    /// Submits a job (its events go to its sink, e.g. a [`ChannelSink`]).
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        Ok(self.0.submit(job)?)
    }

    /// Session `id`'s ids and state (idle only).
    pub async fn save(
        &self,
        id: String,
    ) -> Result<
        Result<hearth_engine::scheduler::SavedSession, hearth_engine::session::StoreError>,
        ApiError,
    > {
        let (tx, rx) = oneshot::channel();
        self.0.save(id, move |r| {
            let _ = tx.send(r);
        })?;
        rx.await
            .map_err(|_| ApiError::server("session save did not complete"))
    }

    /// Creates or replaces session `id` from a saved one.
    pub async fn restore(
        &self,
        id: String,
        saved: hearth_engine::scheduler::SavedSession,
    ) -> Result<Result<usize, hearth_engine::session::StoreError>, ApiError> {
        let (tx, rx) = oneshot::channel();
        self.0.restore(id, saved, move |r| {
            let _ = tx.send(r);
        })?;
        rx.await
            .map_err(|_| ApiError::server("session restore did not complete"))
    }

    /// Resets session `id`; false when there is no such session.
    pub async fn reset(&self, id: String) -> Result<bool, ApiError> {
        let (tx, rx) = oneshot::channel();
        self.0.reset(id, move |existed| {
            let _ = tx.send(existed);
        })?;
        rx.await
            .map_err(|_| ApiError::server("session reset did not complete"))
    }

    /// Closes session `id`; false when there is no such session.
    pub async fn close(&self, id: String) -> Result<bool, ApiError> {
        let (tx, rx) = oneshot::channel();
        self.0.close(id, move |existed| {
            let _ = tx.send(existed);
        })?;
        rx.await
            .map_err(|_| ApiError::server("session close did not complete"))
    }

    /// Frees every session; how many it freed (or will, once generating).
    pub async fn clear(&self) -> Result<usize, ApiError> {
        let (tx, rx) = oneshot::channel();
        self.0.clear(move |n| {
            let _ = tx.send(n);
        })?;
        rx.await
            .map_err(|_| ApiError::server("clearing the sessions did not complete"))
    }

    /// Stops every request (they get an error event) and ends the thread.
    pub fn shutdown(&self) {
        self.0.shutdown();
    }
}
