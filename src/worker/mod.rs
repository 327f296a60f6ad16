//! The background worker: its process, its launcher, its transactions and pages.

pub(crate) mod activity;
pub(crate) mod admit;
pub(crate) mod launcher;
pub(crate) mod process;
pub(crate) mod scan;
pub(crate) mod shared_progress;
pub(crate) mod xact;
