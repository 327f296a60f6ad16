//! Who runs what, and with which rights.
//!
//! Three roles take part in a backfill:
//! - the caller of a SQL function, who must hold the rights a backfill exercises: `SELECT` and
//!   `UPDATE` on each table (its pages lock rows `FOR SHARE`, which PostgreSQL reserves for
//!   roles that may update them), and `REPLICATION` to bind it to a slot;
//! - the table's owner, as whom every query that reaches the table runs (the estimate's sample,
//!   the key histogram, every page): user-defined code reachable from a table (a type's cast to
//!   json, a domain's check, an input function) then runs with no more rights than the table's
//!   owner has, whoever started the backfill. This is how `ANALYZE` runs index expressions;
//! - the extension's owner (a superuser), as whom the state tables are written, by the API for
//!   the caller and by the worker, which connects as the bootstrap superuser.
//!
//! Whenever the role changes, [`run_as`] also fixes `search_path` to `pg_catalog, pg_temp` and
//! makes the code a security-restricted operation, so that nothing resolved by name can be a
//! function or operator that the caller planted in a schema of its own, and nothing the owner's
//! code changes (settings, temporary objects) outlives the call.

use crate::pg::errors::raise;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// The settings that fix how values print as text, as the worker has them (worker/process.rs): key
/// values cast to text or JSON under them are what the worker reads back, and the same on every
/// server. And `search_path`, so that nothing resolved by name can be a function or operator
/// planted in a schema on the caller's path.
const PORTABLE_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 5] = [
    (c"search_path", c"pg_catalog, pg_temp"),
    (c"DateStyle", c"ISO"),
    (c"TimeZone", c"UTC"),
    (c"IntervalStyle", c"postgres"),
    (c"extra_float_digits", c"1"),
];

/// Runs `f` with [`PORTABLE_SETTINGS`], and every setting `f` changes undone when it returns.
/// An error inside `f` aborts the (sub)transaction, which restores the settings by itself.
pub fn with_portable_settings<R>(f: impl FnOnce() -> R) -> R {
    crate::pg::settings::with_settings(&PORTABLE_SETTINGS, f)
}

/// Runs `f` as `role` inside a security-restricted operation, with [`PORTABLE_SETTINGS`]
/// (`search_path` `pg_catalog, pg_temp`) and every setting `f` changes undone when it returns
/// (as `do_analyze_rel` does). An error inside `f` aborts the (sub)transaction, which restores
/// the caller's identity and settings by itself.
pub fn run_as<R>(role: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    let (mut caller, mut context) = (pg_sys::InvalidOid, 0);
    // SAFETY: plain reads and writes of the backend's current user and security context, which
    // every transaction and subtransaction abort restores to the values saved at its start.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut caller, &mut context);
        pg_sys::SetUserIdAndSecContext(role, context | pg_sys::SECURITY_RESTRICTED_OPERATION as i32);
    }
    let result = with_portable_settings(f);
    // SAFETY: as above.
    unsafe { pg_sys::SetUserIdAndSecContext(caller, context) };
    result
}

/// Runs `f`, whose queries read table `relid`, as `role` (see [`run_as`]), refusing a query
/// that reads another relation than `relid`: a name `f` reads the table by may have come to
/// name another relation since the table was checked (see read_guard.rs).
pub fn read_as<R>(role: pg_sys::Oid, relid: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    run_as(role, || crate::pg::read_guard::reading(relid, f))
}

/// Runs `f`, a query of table `relid` for a checksum or a comparison, as the table's owner (see
/// [`run_as`]): its code, such as a cast to json of its key's type, never runs as a superuser who
/// checks the table. Unless row-level security filters the table's rows for the caller: the
/// caller then reads the rows it may see, as any query of it would, as itself.
pub fn read_as_owner<R>(relid: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    let found = Spi::connect(|client| {
        let row = client
            .select(
                "SELECT c.relowner, pg_catalog.row_security_active(c.oid) FROM pg_catalog.pg_class c
                  WHERE c.oid OPERATOR(pg_catalog.=) $1",
                Some(1),
                &[relid.into()],
            )?
            .first();
        Ok::<_, pgrx::spi::Error>(if row.is_empty() {
            None
        } else {
            Some((row.get::<pg_sys::Oid>(1)?, row.get::<bool>(2)?))
        })
    })
    .ok()
    .flatten();
    match found {
        Some((Some(owner), Some(false))) => read_as(owner, relid, f),
        _ => with_portable_settings(|| crate::pg::read_guard::reading(relid, f)),
    }
}

/// Runs `f` as the owner of pg_backfill's state tables: the extension's owner.
pub fn as_extension_owner<R>(f: impl FnOnce() -> R) -> R {
    let owner = crate::pg::spi::select_one::<pg_sys::Oid>(
        "SELECT extowner FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pg_backfill'",
        &[],
    )
    .ok()
    .flatten()
    .unwrap_or_else(|| {
        raise(
            ERRCODE_UNDEFINED_OBJECT,
            "extension \"pg_backfill\" is not installed in this database",
            "pg_backfill keeps its state in the tables of its extension.",
            Some("CREATE EXTENSION pg_backfill;".into()),
        )
    });
    run_as(owner, f)
}

/// Binding a backfill to a slot makes it hold the slot's consumer back (back-pressure, pauses)
/// and read its position: the caller needs the rights that consuming from the slot needs.
pub fn require_replication(slot: &str) {
    // SAFETY: reads the current user's role attributes from the catalog cache.
    let allowed = unsafe { pg_sys::has_rolreplication(pg_sys::GetUserId()) || pg_sys::superuser() };
    if !allowed {
        raise(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied to bind a backfill to replication slot \"{slot}\""),
            "Binding a backfill to a slot needs the rights that consuming from the slot needs: \
             the REPLICATION attribute, or superuser.",
            Some("Start it as the pipeline's replication role, or without slot => ....".into()),
        );
    }
}

/// Whether the current user is a superuser (who may control any backfill).
pub fn is_superuser() -> bool {
    // SAFETY: reads the current user's role attributes from the catalog cache.
    unsafe { pg_sys::superuser() }
}

/// The worker, at every page: the role that started the backfill must still exist and still
/// hold every right a start checks (see model/table.rs's inspect and [`require_replication`]):
/// `SELECT`, and `UPDATE` for the row locks, on the table; no row-level security filtering the
/// table for it (a page delivers every row); and, for a backfill bound to `slot`, `REPLICATION`.
/// A right lost mid-run stops the backfill instead of leaving it doing what its starter no
/// longer could.
pub fn require_starter_rights(started_by: &str, relid: pg_sys::Oid, table: &str, slot: Option<&str>) {
    // The role's name in the database's encoding, as the catalog has it.
    let Ok(name) = std::ffi::CString::new(crate::pg::encoding::to_server(started_by).into_owned()) else { return };
    // SAFETY: catalog-cache lookups of a role by name, of its attributes and of a relation's
    // privileges and row security; the relation is locked by the page.
    let (may_read_and_lock, filtered, may_replicate) = unsafe {
        let role = pg_sys::get_role_oid(name.as_ptr(), true);
        let has = |mode: u32| {
            pg_sys::pg_class_aclcheck(relid, role, pg_sys::AclMode::from(mode)) == pg_sys::AclResult::ACLCHECK_OK
        };
        let exists = role != pg_sys::InvalidOid;
        (
            exists
                && has(pg_sys::ACL_SELECT)
                && (has(pg_sys::ACL_UPDATE)
                    || pg_sys::pg_attribute_aclcheck_all(
                        relid,
                        role,
                        pg_sys::AclMode::from(pg_sys::ACL_UPDATE),
                        pg_sys::AclMaskHow::ACLMASK_ANY,
                    ) == pg_sys::AclResult::ACLCHECK_OK),
            exists && pg_sys::check_enable_rls(relid, role, true) == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32,
            exists && (pg_sys::has_rolreplication(role) || pg_sys::superuser_arg(role)),
        )
    };
    if !may_read_and_lock {
        raise(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("role \"{started_by}\" may no longer backfill table {table}"),
            format!(
                "Backfill pages lock rows FOR SHARE with the rights of the role that started it; \
                 role \"{started_by}\" was dropped or lost SELECT or UPDATE on table {table}."
            ),
            Some("Grant the privileges back and SELECT backfill_resume(...), or start a new backfill as a role that has them.".into()),
        );
    }
    if filtered {
        raise(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("row-level security now filters the rows of table {table} for role \"{started_by}\""),
            format!(
                "A backfill delivers every row of its table, so its starter must see every row; row-level security \
                 was enabled for table {table}, or role \"{started_by}\" lost BYPASSRLS, during the backfill."
            ),
            Some("Start a new backfill as the table's owner or as a role with BYPASSRLS.".into()),
        );
    }
    if let Some(slot) = slot.filter(|_| !may_replicate) {
        raise(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("role \"{started_by}\" may no longer bind a backfill to replication slot \"{slot}\""),
            format!(
                "Binding a backfill to a slot needs the rights that consuming from the slot needs; role \
                 \"{started_by}\" lost the REPLICATION attribute during the backfill."
            ),
            Some("ALTER ROLE ... REPLICATION and SELECT backfill_resume(...), or start a new backfill as the pipeline's replication role.".into()),
        );
    }
}

/// Whether role `member` may act as role `role` (both by name; false if either does not
/// exist): who sees and controls a role's backfills, and whom `pg_monitor` counts. Not
/// `pg_has_role(..., 'MEMBER')`, which since 16 also counts a member with neither the role's
/// privileges nor the right to become it (see compat::may_act_as).
#[pg_extern(schema = "backfill", stable)]
fn may_act_as(member: &str, role: &str) -> bool {
    let (Some(member), Some(role)) = (role_named(member), role_named(role)) else {
        return false;
    };
    crate::pg::compat::may_act_as(member, role)
}

/// Whether the current user may act as the role of that name (see [`may_act_as`]).
pub fn caller_may_act_as(role: &str) -> bool {
    // SAFETY: the current user's id.
    let caller = unsafe { pg_sys::GetUserId() };
    role_named(role).is_some_and(|role| crate::pg::compat::may_act_as(caller, role))
}

/// The id of the role of that name, if there is one.
pub fn role_named(name: &str) -> Option<pg_sys::Oid> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: a catalog lookup by a NUL-terminated name; missing_ok, so it raises nothing.
    let oid = unsafe { pg_sys::get_role_oid(name.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The current role's name (in the database's encoding, converted: see encoding.rs), as a
/// backfill records who started it.
pub fn current_role_name() -> String {
    crate::pg::spi::select_one::<crate::pg::encoding::Text>("SELECT current_user::pg_catalog.text", &[])
        .ok()
        .flatten()
        .map(|t| t.0)
        .unwrap_or_default()
}

/// Whether the current user may connect to the database (`has_database_privilege`); false for
/// one dropped meanwhile.
pub fn may_connect(database: pg_sys::Oid) -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT pg_catalog.has_database_privilege(d.oid, 'CONNECT')
           FROM pg_catalog.pg_database d WHERE d.oid OPERATOR(pg_catalog.=) $1",
        &[database.into()],
    )
    .ok()
    .flatten()
    .unwrap_or(false)
}
