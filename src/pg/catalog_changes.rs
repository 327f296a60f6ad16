//! Whether the catalog a publication is read from may have changed: a counter this process
//! moves whenever PostgreSQL tells it to forget a publication or a relation it might have
//! cached. A worker reads what its pipeline's publication publishes again only when the counter
//! moved, not on every page: those reads cost about 2 ms a page, 3.5 times a batched backfill's
//! own time (bench/README.md, "A pipeline's backfill, and many tables").
//!
//! PostgreSQL sends an invalidation for every committed change of `pg_publication`,
//! `pg_publication_rel` and `pg_publication_namespace`, and a relation's invalidation for every
//! ALTER TABLE, ATTACH or DETACH PARTITION of it; a process that fell behind on them is told to
//! forget everything, which calls every callback too. So a change can only go unseen while its
//! invalidation is still unread, and a transaction reads them before it takes its snapshot.

use pgrx::pg_sys;
use std::cell::Cell;

thread_local! {
    /// Moved by every invalidation that may change what a publication publishes.
    static GENERATION: Cell<u64> = const { Cell::new(0) };
    static WATCHING: Cell<bool> = const { Cell::new(false) };
}

/// The counter now. Watching starts with the first call: before it, every change counts (a
/// caller compares with what it saw last, and has seen nothing yet).
///
/// Read it right after the transaction's snapshot is taken, before the transaction takes any
/// lock: invalidations are read then too, and one read after the snapshot may be of a change the
/// snapshot does not show. The counter read before it has not moved for that change, so the
/// next transaction sees the counter moved and reads the catalog again.
pub fn publication_generation() -> u64 {
    if !WATCHING.get() {
        watch();
    }
    GENERATION.get()
}

fn watch() {
    WATCHING.set(true);
    // Bumped once more, so that nobody who read the counter before watching began takes it as
    // unchanged.
    bump();
    // SAFETY: registers callbacks for this process's lifetime (PostgreSQL has no way to remove
    // them); `WATCHING` makes sure it happens once, far below PostgreSQL's per-process limits.
    unsafe {
        for cache in [
            pg_sys::SysCacheIdentifier::PUBLICATIONOID,
            pg_sys::SysCacheIdentifier::PUBLICATIONREL,
            pg_sys::SysCacheIdentifier::PUBLICATIONNAMESPACE,
        ] {
            pg_sys::CacheRegisterSyscacheCallback(cache as _, Some(catalog_changed), pg_sys::Datum::from(0));
        }
        pg_sys::CacheRegisterRelcacheCallback(Some(relation_changed), pg_sys::Datum::from(0));
    }
}

fn bump() {
    GENERATION.set(GENERATION.get().wrapping_add(1));
}

// SAFETY (both callbacks): called by PostgreSQL while it reads invalidations; they only move a
// counter of this process, and cannot fail.
unsafe extern "C-unwind" fn catalog_changed(_arg: pg_sys::Datum, _cache: std::ffi::c_int, _hash: u32) {
    bump();
}

unsafe extern "C-unwind" fn relation_changed(_arg: pg_sys::Datum, _relid: pg_sys::Oid) {
    bump();
}
