//! What holds a backfill back: page locking, pacing, the consumer's slot, the source's load, the
//! gentle default's duty cycle.

pub(crate) mod backpressure;
pub(crate) mod duty;
pub(crate) mod lock;
pub(crate) mod pacing;
pub(crate) mod pipeline;
pub(crate) mod wait;
