//! PostgreSQL plumbing that every layer above uses: errors, encodings, SPI, settings, privileges,
//! argument checks, a query's rows to Rust as they are produced, and what Citus's metadata says of a table.

pub(crate) mod args;
pub(crate) mod catalog_changes;
pub(crate) mod citus;
pub(crate) mod compat;
pub(crate) mod encoding;
pub(crate) mod errors;
pub(crate) mod locks;
pub(crate) mod nodes;
pub(crate) mod privilege;
pub(crate) mod read_guard;
pub(crate) mod receiver;
pub(crate) mod settings;
pub(crate) mod spi;
pub(crate) mod wal;
