//! The background worker: its process, its launcher, its transactions and pages.

pub(crate) mod activity;
pub(crate) mod keyed_page;
pub(crate) mod launcher;
pub(crate) mod page;
pub(crate) mod process;
pub(crate) mod progress;
pub(crate) mod xact;
